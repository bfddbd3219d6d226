"""The web surface: the approval inbox for reviewers and the HTTP API under /api/v1.

    app.py     create_app(config, registry, *, ledger_factory): the FastAPI app
    api.py     /api/v1: JSON in and out, errors as {"error": {"code", "message"}}
    shapes.py  the API's JSON shapes (pydantic models: its OpenAPI document)
    pages.py   the page renderer (Jinja2 templates under templates/, static/), sign-in,
               history
    waiting.py the waiting list, batch decisions, a request's page and its decision
    slack.py   POST /slack/actions: Slack's signed clicks (broker.slack does the rest)
    auth.py    approvers' hashed tokens, sessions, CSRF
    inbox.py   what all share: the web's own ledger connections, cards, decisions
               (what a list shows of a card is broker.approval.card)
    render.py  untrusted text as HTML, hidden characters shown
    server.py  WebServer (uvicorn on a thread) and start_web for serve/run
    cli.py     `broker web token NAME`

Nothing is imported here, so that `broker web token` stays as quick as the rest of the
CLI: import broker.web.app or broker.web.server.
"""
