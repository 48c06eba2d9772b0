"""The dashboard in real Chromium while a real rollout runs on the session vLLM.

The page loads, shows the rollout's planned episodes, its count of finished
episodes grows while the engine runs, a finished episode's turns open on a
click, and SIGTERM stops the server (exit 0). A full-page screenshot is left in
the test's tmp_path (docs/img/dashboard.png was taken this way).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from rollout_engine.envs.browser import CHROMIUM_FLAGS, find_chromium
from tests.conftest import REPO, env_python
from tests.e2e.conftest import free_port
from tests.e2e.rollout_cli import engine_env, rollout_cmd
from tests.waits import START_S, generation_s, wait_until

pytestmark = pytest.mark.e2e

#: 6 tasks x 4 samples through 4 sessions: the episodes end in waves, so the page sees the count grow
ROLLOUT = [
    "env_config.train_tasks_rollout_size=6",
    "env_config.n_samples_per_task=4",
    "env_config.max_vllm_sessions=4",
    "env_config.server_size=4",
    "policy_config.max_new_tokens=32",
]
EPISODES, MAX_TOKENS = 24, 32


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group we started, then SIGKILL what is left."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_the_dashboard_follows_a_real_rollout_in_chromium(vllm_server, data_dir: Path, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = find_chromium()
    if chromium is None:
        pytest.fail("no Chromium at /usr/lib/chromium/chromium or /usr/bin/chromium (set BATON_CHROMIUM)")
    log, port = tmp_path / "log", free_port()
    log.mkdir()
    url = f"http://127.0.0.1:{port}/"
    dash_err = (tmp_path / "dashboard.err").open("w+")
    dashboard = subprocess.Popen(
        [env_python("app"), "-m", "coordinator", "dashboard", "--log-path", str(log), "--port", str(port)],
        cwd=REPO,
        env=engine_env(),
        stderr=dash_err,
        start_new_session=True,
    )
    engine_log = (tmp_path / "rollout.log").open("w")
    rollout = None
    try:
        wait_until(lambda: answers(url + "api/state"), waiting_for=f"the dashboard to answer on {url}", timeout=START_S)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=list(CHROMIUM_FLAGS))
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(url)
            page.wait_for_selector("#rollouts h2")
            assert "no rollout has started" in page.inner_text("#rollouts")

            cmd = rollout_cmd("rollout_train", data_dir, log, vllm_server.base_url, *ROLLOUT)
            rollout = subprocess.Popen(cmd, cwd=REPO, env=engine_env(), stdout=engine_log, stderr=engine_log)
            seen: list[int] = []

            def planned_shown() -> bool:
                return page.locator("#planned-total").count() > 0 and page.inner_text("#planned-total") == "24"

            wait_until(planned_shown, waiting_for="the page to show the rollout's 24 planned episodes", timeout=START_S)
            deadline = time.monotonic() + generation_s(EPISODES, MAX_TOKENS)
            while rollout.poll() is None and time.monotonic() < deadline:
                seen.append(int(page.inner_text("#finished-total")))
                time.sleep(0.5)
            assert rollout.poll() == 0, f"the rollout did not finish in time (or failed); see {tmp_path}/rollout.log"
            while_running = sorted(set(seen))
            assert len(while_running) >= 2 and while_running[0] < EPISODES, (
                f"the finished count did not grow on the page while the rollout ran (seen {while_running})"
            )
            assert seen == sorted(seen), f"the finished count went back: {seen}"
            wait_until(
                lambda: page.inner_text("#finished-total") == "24",
                waiting_for="the page to show all 24 episodes finished",
                timeout=30,
            )
            assert page.locator("#grid .cell[data-episode]").count() == EPISODES

            first = page.locator('#grid .cell[data-state="done"]').first
            episode_id = first.get_attribute("data-episode")
            first.click()
            page.wait_for_selector("#episode .turn", timeout=30_000)
            text = page.inner_text("#episode")
            row = next(
                json.loads(line)
                for line in (log / "trajectories/train/iter_0000/rank_0.jsonl").read_text().splitlines()
                if json.loads(line)["episode_id"] == episode_id
            )
            assert f"Episode {episode_id}" in text and "response" in text and "messages" in text
            assert row["turns"][0]["response"].strip()[:40] in text
            page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
            assert not errors, f"the page's script failed: {errors}"
            browser.close()
    finally:
        if rollout is not None:
            stop(rollout)
        engine_log.close()
        if dashboard.poll() is None:
            os.killpg(dashboard.pid, signal.SIGTERM)
        try:
            code = dashboard.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(dashboard.pid, signal.SIGKILL)
            dashboard.wait()
            pytest.fail("the dashboard did not stop within 10 s of SIGTERM")
        dash_err.seek(0)
        said = dash_err.read()
        dash_err.close()
    assert code == 0 and "dashboard: stopped" in said, said
