"""Minting and revoking the credential of one apply: the built-in providers.

Each module is one provider kind (`[credentials.NAME] kind = ...`), implementing
`broker.grants.Provider`; it imports the kernel only, and its service's library only
when it mints.
"""
