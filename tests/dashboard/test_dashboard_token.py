"""The dashboard never hands out the API token.

A real control plane, `streamlit run` of the dashboard holding the API token, and headless
Chromium recording everything it receives: every HTTP response body and every websocket frame.
The operator watches without signing in, is refused a change, signs in (typing the sign-in
token, by default the API token itself) and changes the policy; the change reaches the control
plane with the token the dashboard holds, and the token is in nothing the browser received.

Under AppTest: the sign-in hint names the token file without its path, and
wrong sign-in tokens are throttled per session (the right one is then refused too, uncompared).
"""

from __future__ import annotations

import httpx
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import state
from tests.backend.conftest import TOKEN, free_port
from tests.dashboard.stack import (
    APP,
    HANG_GUARD_MS,
    Dashboard,
    sign_in,
    tiny_run,
    wait_until,
)

SIGN_IN = "dashboard-sign-in-789"


class Received:
    """Everything a page receives: response bodies (read at the end) and websocket frames."""

    def __init__(self, page) -> None:
        self.responses, self.frames = [], []
        page.on("response", lambda response: self.responses.append(response))
        page.on("websocket", lambda ws: ws.on("framereceived",
                                               lambda frame: self.frames.append(frame)))

    def holding(self, secret: str) -> list[str]:
        """Where `secret` appears: URLs of responses, indexes of frames."""
        needle = secret.encode()
        found = []
        for response in self.responses:
            try:
                body = response.body()
            except Exception:  # a redirect or a body the browser did not keep: nothing received
                continue
            if needle in body or needle in str(response.headers).encode():
                found.append(response.url)
        for i, frame in enumerate(self.frames):
            data = frame.encode() if isinstance(frame, str) else bytes(frame)
            if needle in data:
                found.append(f"websocket frame {i}")
        return found


@pytest.fixture
def live_run(fresh_api):
    with httpx.Client(base_url=fresh_api.url, timeout=30,
                      headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        r = http.post("/runs", json={"config": tiny_run(10_000_000, eval_interval=100)})
        assert r.status_code == 201, r.text
        run_id = r.json()["id"]
        wait_until(lambda: http.get(f"/runs/{run_id}").json()["step"] > 0, what="first steps")
        yield http, run_id
        http.post(f"/runs/{run_id}/stop")


@pytest.mark.parametrize("own_sign_in", [False, True], ids=["api-token", "own-token"])
def test_the_browser_never_receives_the_token(browser, fresh_api, live_run, tmp_path,
                                              own_sign_in):
    from playwright.sync_api import expect

    http, run_id = live_run
    env = {"ASTERIA_DASHBOARD_TOKEN": SIGN_IN} if own_sign_in else {}
    with Dashboard(free_port(), fresh_api.url, TOKEN, tmp_path / "streamlit.log", **env) as dash:
        page = browser.new_page(viewport={"width": 1400, "height": 2400})
        received = Received(page)
        page.goto(dash.url)
        page.get_by_test_id("stMetric").first.wait_for(timeout=HANG_GUARD_MS)
        form = page.get_by_label("Staleness bound S (steps)")
        before = http.get(f"/runs/{run_id}/policy").json()

        # Watching needs no sign-in; a change does, and nothing is sent without it.
        form.fill(str(before["policy"]["staleness_bound"] + 1))
        page.get_by_role("button", name="Apply policy change").click()
        expect(page.get_by_test_id("stAlert").filter(has_text="Not signed in")).to_be_visible(
            timeout=HANG_GUARD_MS)
        assert http.get(f"/runs/{run_id}/policy").json()["version"] == before["version"]

        sign_in(page, SIGN_IN if own_sign_in else TOKEN)
        assert page.get_by_label("Sign-in token").count() == 0
        bound = before["policy"]["staleness_bound"] + 2
        form.fill(str(bound))
        page.get_by_role("button", name="Apply policy change").click()
        expect(page.get_by_test_id("stAlert").filter(has_text="Accepted")).to_contain_text(
            f"version {before['version'] + 1}", timeout=HANG_GUARD_MS)
        policy = wait_until(lambda: (p := http.get(f"/runs/{run_id}/policy").json())["version"]
                            > before["version"] and p, what="the change applied")
        assert policy["policy"]["staleness_bound"] == bound
        page.wait_for_timeout(5000)  # a few of the live page's refreshes after signing in
        assert received.frames, "no websocket frame recorded: nothing was checked"
        assert received.holding(TOKEN) == []
        assert TOKEN not in page.content()
        page.close()


# ---------------------------------------------------------------------- AppTest: the sign-in
@pytest.fixture
def no_failed_sign_ins():
    state._all_failures.clear()  # the count over all sessions lives in the process
    yield
    state._all_failures.clear()


def sidebar_text(at: AppTest) -> str:
    return "\n".join(str(e.value) for kind in ("caption", "error", "markdown")
                     for e in at.sidebar.get(kind))


def try_sign_in(at: AppTest, typed: str) -> AppTest:
    at.text_input(key="sign_in_token").input(typed)
    return at.button(key="sign_in_submit").click().run()


def test_the_sign_in_hint_names_the_token_file_without_its_path(api, monkeypatch, tmp_path):
    data = tmp_path / "operators-private-folder"
    data.mkdir()
    (data / "token").write_text(TOKEN + "\n")
    monkeypatch.delenv("ASTERIA_TOKEN", raising=False)
    monkeypatch.delenv("ASTERIA_TOKEN_FILE", raising=False)
    monkeypatch.delenv("ASTERIA_DASHBOARD_TOKEN", raising=False)
    monkeypatch.delenv("ASTERIA_DASHBOARD_TOKEN_FILE", raising=False)
    monkeypatch.setenv("ASTERIA_URL", api.url)
    monkeypatch.setenv("ASTERIA_DATA_DIR", str(data))
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    text = sidebar_text(at)
    assert "the token file `token` in the server's data folder" in text
    assert str(tmp_path) not in text and "operators-private-folder" not in text

    monkeypatch.setenv("ASTERIA_DASHBOARD_TOKEN_FILE", str(data / "sign-in"))
    (data / "sign-in").write_text("another-secret\n")
    text = sidebar_text(AppTest.from_file(str(APP), default_timeout=60).run())
    assert "the file `sign-in` that ASTERIA_DASHBOARD_TOKEN_FILE names" in text
    assert "operators-private-folder" not in text


def test_wrong_sign_in_tokens_are_throttled_per_session(api, monkeypatch, no_failed_sign_ins):
    monkeypatch.setenv("ASTERIA_URL", api.url)
    monkeypatch.setenv("ASTERIA_TOKEN", TOKEN)
    monkeypatch.delenv("ASTERIA_DASHBOARD_TOKEN", raising=False)
    monkeypatch.delenv("ASTERIA_DASHBOARD_TOKEN_FILE", raising=False)
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    for n in range(state.SIGN_IN_BURST - 1):
        assert "That is not the sign-in token." in sidebar_text(try_sign_in(at, f"guess-{n}"))
    assert "Too many wrong tokens: try again in" in sidebar_text(try_sign_in(at, "guess-last"))
    # Now even the right token is refused, with the same words, and nothing is signed in.
    assert "Too many wrong tokens: try again in" in sidebar_text(try_sign_in(at, TOKEN))
    assert not at.session_state[state.SIGNED_IN]
    assert at.text_input(key="sign_in_token") is not None
    # Another session has its own count: the right token signs it in.
    other = AppTest.from_file(str(APP), default_timeout=60).run()
    other = try_sign_in(other, TOKEN)
    assert other.session_state[state.SIGNED_IN]
    assert "Signed in" in sidebar_text(other)
