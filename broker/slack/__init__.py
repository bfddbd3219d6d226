"""Slack: waiting requests as interactive messages, decided with a click.

    settings.py  [notify.slack] and [approvers.NAME] slack_user, checked at start
    signing.py   Slack's request signatures (v0 HMAC-SHA256, five-minute window)
    store.py     which message shows which request, reminders sent, signatures seen
    api.py       the Web API calls (chat.postMessage, chat.update, views.open, response_url)
    messages.py  a request's card as Block Kit, every untrusted string neutralised
    notifier.py  posts, updates and reminds, on its own thread (an observer of the broker)

The callback endpoint Slack posts clicks to is broker/web/slack_actions.py. Buttons appear only
where the policy rule says `slack_buttons = true` (and, on an irreversible request,
`slack_buttons_irreversible = true`); every click is checked again there.
"""
