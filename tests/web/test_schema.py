"""The API against its own OpenAPI document: generated inputs never cause a 500."""

from __future__ import annotations

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support import TLS
from tests.web.conftest import TOKENS, Web

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def test_generated_input_gets_documented_answers(web: Web) -> None:
    """Every operation, fed valid and invalid generated input, answers as documented, no 5xx."""
    waiting = web.gated()
    doc = httpx.get(f"{web.url}/api/v1/openapi.json", verify=TLS).json()
    schema = schemathesis.openapi.from_dict(doc)
    headers = {"Authorization": f"Bearer {TOKENS['alice']}"}
    seen = []
    for result in schema.get_all_operations():
        operation = result.ok()
        spec = doc["paths"][operation.path][operation.method.lower()]
        takes_input = "parameters" in spec or "requestBody" in spec
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)[: 2 if takes_input else 1]:

            @settings(
                max_examples=15,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def check(case: schemathesis.Case) -> None:
                response = case.call(base_url=web.url, headers=headers)
                case.validate_response(response, checks=CHECKS)

            check()
        seen.append(operation.label)
    assert "POST /api/v1/requests/{sandbox}/{request_id}/decision" in seen
    assert "POST /api/v1/decisions" in seen
    assert "POST /api/v1/policy/replay" in seen
    assert len(seen) == 10
    still = web.client().get(f"/api/v1/requests/default/{waiting['id']}").json()
    assert still["status"] == "pending"  # no generated input decided it
