"""http.request: one HTTP request, to a URL or to a destination the host names.

Settings, `[integrations.http]` (all optional):

    allow_networks = ["127.0.0.0/8"]    # exact networks the address guard lets through
    max_response_bytes = 1048576        # the body returned to the agent, at most
    max_response_time = "30s"           # the whole exchange, at most
    max_redirects = 5                   # when a request sets follow_redirects
    ca_file = "/etc/ssl/internal.pem"   # extra CA to trust, besides the public roots

    [integrations.http.destinations.crm]
    base_url = "https://crm.example.com/api"
    headers = { Accept = "application/json" }
    secret_headers = { Authorization = { value_env = "CRM_TOKEN", prefix = "Bearer " } }
    allow_networks = ["10.1.2.0/24"]    # only for requests to this destination
    methods = ["GET", "HEAD"]           # optional: the only methods sent to its origin

The agent sends `{"method": "GET", "url": "https://..."}` or
`{"method": "GET", "destination": "crm", "path": "/v2/contacts"}`; a destination's
headers are added host-side, and its secret headers only ever go to its own origin
(never along a redirect elsewhere). A destination with `methods` takes no other: a
request through it, a raw URL at its origin and a redirect hop there with another
method are refused (absent: every method in the schema). Every connection passes
`effects.netguard`.

Modules, one per concern:

    settings   [integrations.http], checked, and its destinations
    calls      params → `Call`, the request as it will be sent
    handler    `HttpRequest`: check, preview, the exchange and its redirects
    responses  the output the agent reads, secrets masked
"""

from __future__ import annotations

from effects.http.calls import FRAMING_HEADERS, SAFE_METHODS, Call, build_call
from effects.http.handler import HttpRequest
from effects.http.settings import METHODS, Destination, HttpSettings, settings_from

__all__ = [
    "FRAMING_HEADERS",
    "METHODS",
    "SAFE_METHODS",
    "Call",
    "Destination",
    "HttpRequest",
    "HttpSettings",
    "build_call",
    "settings_from",
]
