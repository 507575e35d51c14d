"""The page session credential (web/page_session.py) and the router's check of it: a cookie this
process issued passes only with the page's header, a forged or foreign one never, and the router
takes it beside the API keys only where the composition root wires it in."""

from __future__ import annotations

import pytest
from flask import Flask, Response, request

from engine.errors import ServingError
from engine.serving.routing.router import Router, RouterConfig
from web.page_session import COOKIE, HEADER, PageSessions

pytestmark = pytest.mark.unit


def issued_cookie(sessions: PageSessions) -> str:
    app = Flask(__name__)
    with app.test_request_context("/steps/1"):
        response = sessions.issue(request, Response("<html></html>", mimetype="text/html"))
    header = response.headers["Set-Cookie"]
    assert "HttpOnly" in header and "SameSite=Strict" in header and "Path=/" in header
    return header.split(";", 1)[0].split("=", 1)[1]


def credential_of(sessions: PageSessions, cookie: str | None, page_header: bool) -> str | None:
    headers = {HEADER: "1"} if page_header else {}
    if cookie is not None:
        headers["Cookie"] = f"{COOKIE}={cookie}"
    with Flask(__name__).test_request_context("/v1/completions", method="POST", headers=headers):
        return sessions.credential(request)


def test_a_page_gets_a_cookie_and_its_requests_a_credential() -> None:
    sessions = PageSessions()
    cookie = issued_cookie(sessions)
    credential = credential_of(sessions, cookie, page_header=True)
    assert credential is not None and sessions.is_page_credential(credential)
    assert credential_of(sessions, cookie, page_header=False) is None  # another site's form
    assert credential_of(sessions, None, page_header=True) is None
    forged = cookie.split(".")[0] + "." + "0" * 64
    assert credential_of(sessions, forged, page_header=True) is None
    assert credential_of(PageSessions(), cookie, page_header=True) is None  # another process's
    assert not sessions.is_page_credential(cookie) and not sessions.is_page_credential("sk-anything")


def test_json_responses_and_a_valid_cookie_get_no_new_cookie() -> None:
    sessions = PageSessions()
    cookie = issued_cookie(sessions)
    app = Flask(__name__)
    with app.test_request_context("/v1/models"):
        assert "Set-Cookie" not in sessions.issue(request, Response("{}", mimetype="application/json")).headers
    with app.test_request_context("/lab", headers={"Cookie": f"{COOKIE}={cookie}"}):
        assert "Set-Cookie" not in sessions.issue(request, Response("", mimetype="text/html")).headers


def test_the_router_takes_a_page_credential_beside_the_keys() -> None:
    sessions = PageSessions()
    credential = credential_of(sessions, issued_cookie(sessions), page_header=True)
    locked = Router([], RouterConfig(api_keys=["k1"]), dispatch_thread=False)
    locked.authorize("k1")
    with pytest.raises(ServingError) as refused:
        locked.authorize(credential)  # not wired: a page credential is no key
    assert refused.value.status == 401
    locked.config.issued = sessions.is_page_credential
    locked.authorize(credential)
    for bad in (None, "k2", "page:forged.00"):
        with pytest.raises(ServingError):
            locked.authorize(bad)
    Router([], RouterConfig(), dispatch_thread=False).authorize(None)  # no keys: open
