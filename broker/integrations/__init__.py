"""Integrations with the agent frameworks people already run.

- :mod:`broker.integrations.autogen`: AutoGen's code executor and approval gate
  (``pip install 'sandbox-outbox-broker[autogen]'``).

The pieces under them need no framework: :mod:`~broker.integrations.embedded` (a
sandbox's directories, served), :mod:`~broker.integrations.blocks` (code blocks in a
long-lived sandbox container) and :mod:`~broker.integrations.autogen_gate` (asking the broker
whether code may run).
"""
