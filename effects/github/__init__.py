"""github.*: pull requests (with the files they change), issues, comments and labels.

Effects: `github.pull_request.create`, `github.pull_request.comment`,
`github.issue.create`, `github.issue.comment`, `github.label.add`.

Settings, `[integrations.github]`:

    token_env = "GITHUB_TOKEN"            # a token (or token_file), or a GitHub App:
    app_id = 12345                        #   the App's id,
    private_key_file = "github-app.pem"   #   its private key (or private_key_env),
    installation_id = 6789                #   and its installation on the account
    credential = "acme-app"               # or a provider: [credentials.acme-app]
    base_url = "https://api.github.com"   # GitHub Enterprise: "https://HOST/api/v3"
    repos = ["acme/*"]                    # optional: the only repositories requests may name
    allow_mentions = false                # true: @user and @org/team in text stay live
    timeout = 15                          # seconds per HTTP request to GitHub

Every call to GitHub is one method of `Api`, named with the REST operation it sends
(`Api.operations()`); the tests run each against Prism serving GitHub's OpenAPI description.

Text the agent writes (titles, bodies, comments, commit messages) is posted with every
`@name` and `@org/team` turned into `@ name` / `@ org/team` (and `&#64;` / `&commat;`
spelled as `@ `), unless `allow_mentions`: GitHub links and notifies only an `@` directly
followed by the name, and the visible space shows a reader what was done. URLs are left
as they are; code blocks are not (a decorator `@cache` becomes `@ cache`). The output
lists the names so neutralised.

`github.pull_request.create` takes `head`, a branch already pushed (`git.push`), or
`head` plus `files`, which the host commits on a new branch `head` made from `base`
through the Git Data API. The preview is the diff GitHub will show: for a pushed branch
from the compare API, for `files` computed against the blobs on `base`. What the
approver saw (the base and head commits, the blob of each path) is remembered with the
request (`ctx.remember`; the broker drops it when the request ends) and re-checked
first: a base or head that moved since makes the result `failed`, not a pull request
nobody saw.

Modules, one per concern:

    settings  [integrations.github], checked, and the PyGithub client with the
              credential of this call (minted for the repository by a GitHub App)
    errors    PyGithub's and requests' exceptions → EffectFailed
    api       `Api`: one method per REST call
    text      mentions neutralised, text on one line
    handler   what the handlers share (allowlist, client, edge, text)
    issues    github.issue.create, github.issue.comment, github.pull_request.comment,
              github.label.add
    changes   `files` decoded and checked; reviewers
    live      a pull request's live state, and its re-check at apply
    diffs     the diff the approver reads
    pulls     github.pull_request.create
"""

from __future__ import annotations

from effects.github.api import Api
from effects.github.errors import edge, translate
from effects.github.issues import IssueComment, IssueCreate, LabelAdd, PullRequestComment
from effects.github.pulls import PullRequestCreate
from effects.github.settings import APP_REVOKE_CALL, APP_TOKEN_CALL, check_settings, client
from effects.github.text import neutralise

HANDLERS = (PullRequestCreate, PullRequestComment, IssueCreate, IssueComment, LabelAdd)

__all__ = [
    "APP_REVOKE_CALL",
    "APP_TOKEN_CALL",
    "HANDLERS",
    "Api",
    "IssueComment",
    "IssueCreate",
    "LabelAdd",
    "PullRequestComment",
    "PullRequestCreate",
    "check_settings",
    "client",
    "edge",
    "neutralise",
    "translate",
]
