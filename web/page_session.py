"""The app's own pages as API clients when SERVELAB_API_KEYS is set (issue 26).

Every HTML page this app serves sets a session cookie (`servelab_page`, HttpOnly, SameSite=Strict)
that carries a random session id and its HMAC under a secret that lives only in this process.
A request to /v1/* with that cookie and the `X-ServeLab-Page` header is a page's own request: the
router accepts it beside the API keys, rate-limited per session. The cookie cannot be read by
script (HttpOnly), is not sent by another site's page (SameSite=Strict), and another origin
cannot add the custom header without a CORS preflight, which this app never grants; a client
that has no page session and no key still gets 401. The pages themselves stay open (a
classroom on localhost), so a person with a browser tab can prompt as that tab does; the keys
guard the API against everything else.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from flask import Request, Response

COOKIE = "servelab_page"
HEADER = "X-ServeLab-Page"
# What the router sees as the request's key: the prefix keeps it apart from any API key.
CREDENTIAL_PREFIX = "page:"


class PageSessions:
    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def _mac(self, session_id: str) -> str:
        return hmac.new(self._secret, session_id.encode(), hashlib.sha256).hexdigest()

    def _valid_cookie(self, value: str | None) -> bool:
        if not value or "." not in value:
            return False
        session_id, mac = value.split(".", 1)
        return hmac.compare_digest(mac, self._mac(session_id))

    def issue(self, request: Request, response: Response) -> Response:
        """Give an HTML response a session cookie unless the browser already holds a valid one."""
        if response.mimetype == "text/html" and not self._valid_cookie(request.cookies.get(COOKIE)):
            session_id = secrets.token_urlsafe(12)
            response.set_cookie(
                COOKIE, f"{session_id}.{self._mac(session_id)}", httponly=True, samesite="Strict", path="/"
            )
        return response

    def credential(self, request: Request) -> str | None:
        """The page credential of a request from one of this app's pages, else None."""
        value = request.cookies.get(COOKIE)
        if request.headers.get(HEADER) != "1" or not self._valid_cookie(value):
            return None
        return CREDENTIAL_PREFIX + str(value)

    def is_page_credential(self, key: str) -> bool:
        """For the router: a credential this process issued to one of its pages."""
        return key.startswith(CREDENTIAL_PREFIX) and self._valid_cookie(key[len(CREDENTIAL_PREFIX) :])
