"""A model of another family and an environment of the user's own, end to end through run.sh (docs/models.md,
docs/environments.md): real vLLM, the rollout engine, LLaMA-Factory.

The model is a toy-size Qwen3 (tests/e2e/toy_model.py: Qwen3's architecture with random weights, the real Qwen
vocabulary, Qwen3's own chat template, which differs from SmolLM2's: no default system prompt, `<think>` blocks,
`enable_thinking`), named by a Hub id that the data path's Hugging Face cache holds. The environment is
docs/examples/my_envs (guess the number, several turns) copied to a folder outside the repository and loaded by
`env_config.python_path`. Two iterations of `--rl-phase both`: the training template is found from the model
(qwen3), `enable_thinking: false` reaches vLLM's prompts and the training rows alike, the token-fidelity check
passes on multi-turn rows, replies cut at max_new_tokens are counted and none of those episodes succeeds, two
policies are promoted and served in place. The run is also the suite's Ctrl+C and `--resume` on one node: SIGINT
mid train rollout, then SIGTERM during the clean-up, ends run.sh (130, the first signal's code) with nothing of it
left, its vLLM included; `--resume` finishes both iterations without a duplicate episode, though its vLLM is
SIGKILLed under the resumed rollout (run.sh restarts it and resumes; no episode fails for it). Then a --resume with
another model and a worker with another model are refused (exit 2, naming both models) before anything starts,
the log path's record untouched.

The reference's agent, a vision-language model looking at screenshots, the same way: a toy-size Qwen3-VL
(tests/e2e/toy_vlm.py, which answers click(e3|e4|e5)) on MiniWoB++ click-test with `env.observation=both`: the
screenshots reach vLLM by file:// URL (each prompt's token ids hold 80 image tokens per screenshot, at most 2), the
journal names them, the update trains rows with images under the template found from the model (qwen3_vl_nothink),
the token-fidelity check passes on them, and the new policy keeps its processor files, is reloaded in place and
evaluated. One vLLM start, three rollouts in Chromium (train and held-out, then the final evaluation) and one
update.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from coordinator import groupfile
from rollout_engine.envs.miniwob import build_tasks
from rollout_engine.images import url_path
from rollout_engine.layout import Layout
from tests.conftest import REPO, default_sigint, env_python
from tests.e2e.conftest import free_port, processes_mentioning, serves
from tests.waits import START_S, VLLM_START_S, communicate_waiting, generation_s, run_waiting, wait_until

pytestmark = pytest.mark.e2e

HUB_ID = "baton-toys/qwen3-toy"
#: the ids of what Qwen3's template ends a prompt with when enable_thinking is false, an empty reasoning block:
#: "<|im_start|>assistant\n<think>\n\n</think>\n\n"
NO_THINKING = [151644, 77091, 198, 151667, 271, 151668, 271]
#: the whole run: two vLLM starts at most (a restart for a reload vLLM refuses), four short rollouts, two updates
RUN_S = 2 * VLLM_START_S + 900


def hub_snapshot(cache: Path, repo_id: str, source: Path) -> Path:
    """`source` as the main revision of `repo_id` in the Hugging Face hub cache `cache` (its layout)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123456789abcdef")
    shutil.copytree(source, repo / "snapshots" / "0123456789abcdef")
    return repo / "snapshots" / "0123456789abcdef"


def build_toy(tmp_path_factory: pytest.TempPathFactory, script: str, name: str) -> Path:
    """The toy model `script` (tests/e2e/) builds, in the train environment, its downloads cached across runs."""
    out = tmp_path_factory.mktemp("toy") / name
    cache = Path.home() / ".cache" / "baton" / "toy-models"
    run_waiting(
        [env_python("train"), str(REPO / "tests/e2e" / script), "--out", str(out), "--cache", str(cache)],
        waiting_for=f"the toy model {name} to be built",
        timeout=300,
        check=True,
    )
    return out


@pytest.fixture(scope="module")
def toy_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_toy(tmp_path_factory, "toy_model.py", "qwen3")


@pytest.fixture
def guess_data(tmp_path: Path, toy_qwen3: Path) -> tuple[Path, Path]:
    """A data path holding the toy in its Hugging Face cache and guess-the-number tasks, and the example's copy
    outside the repository."""
    data, mine = tmp_path / "data", tmp_path / "elsewhere" / "my_envs"
    hub_snapshot(data / ".cache" / "huggingface" / "hub", HUB_ID, toy_qwen3)
    shutil.copytree(REPO / "docs" / "examples" / "my_envs", mine)
    run_waiting(
        [env_python("app"), "-m", "my_envs.tasks", str(data / "guess"), "--train", "48", "--test", "24"],
        waiting_for="the guess tasks",
        timeout=60,
        cwd=mine,
        check=True,
    )
    for split in ("train", "test"):  # the 1..8 ranges, which a toy that guesses digits finds now and then
        path = data / "guess" / f"{split}.jsonl"
        lines = path.read_text().splitlines()
        path.write_text("".join(f"{line}\n" for line in lines if json.loads(line)["family"] == "guess-1-8"))
    return data, mine


def run_sh(data: Path, log: Path, *args: str, timeout: float, port: int | None = None) -> subprocess.CompletedProcess:
    cmd = ["bash", str(REPO / "scripts/run.sh"), "--data-path", str(data), "--log-path", str(log), *args]
    env = {**os.environ, "BATON_VLLM_PORT": str(port or free_port())}
    env.pop("PYTHONPATH", None)
    return run_waiting(cmd, waiting_for=f"run.sh {' '.join(args[:4])}", timeout=timeout, cwd=REPO, env=env)


def start_run_sh(data: Path, log: Path, *args: str, port: int) -> subprocess.Popen:
    """run.sh in the background, SIGINT as a terminal gives it."""
    cmd = ["bash", str(REPO / "scripts/run.sh"), "--data-path", str(data), "--log-path", str(log), *args]
    env = {**os.environ, "BATON_VLLM_PORT": str(port)}
    env.pop("PYTHONPATH", None)
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=default_sigint
    )


def hold_after_next_episode(log: Path, proc: subprocess.Popen, before: int, timeout: float) -> None:
    """Wait (polling fast) until iteration 1's train journal holds more than `before` episodes, then SIGSTOP the
    rollout engine's group: mid-rollout however fast the machine, until run.sh stops it (SIGTERM + SIGCONT)."""
    path = Layout(log).journal("train", 1, 0)
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().count("\n") > before):
        assert proc.poll() is None, f"run.sh exited ({proc.returncode}):\n{proc.stdout.read()[-3000:]}"
        assert time.monotonic() < deadline, f"no train episode journaled after {before} in {timeout:.0f} s"
        time.sleep(0.02)
    signal_group(log, "rollout-train", signal.SIGSTOP)


def signal_group(log: Path, name: str, sig: signal.Signals) -> None:
    """Signal a process group the run recorded (run/rank_0/groups.json)."""
    os.killpg(groupfile.read(Layout(log).groups(0))[name].pgid, sig)


def journal(log: Path, split: str, iteration: int) -> list[dict]:
    path = Layout(log).journal(split, iteration, 0)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_qwen3_with_its_own_template_trains_on_an_environment_from_outside_the_repository(
    guess_data: tuple[Path, Path], tmp_path: Path
) -> None:
    data, mine = guess_data
    log = tmp_path / "log"
    settings = [
        f"model_config.model={HUB_ID}",
        "+model_config.chat_template_kwargs.enable_thinking=false",
        "env=custom",
        "env._target_=my_envs.guess.GuessNumberEnv",
        f"env_config.python_path=[{mine}]",
        "env_config.train_tasks=guess/train.jsonl",
        "env_config.test_tasks=guess/test.jsonl",
    ]
    small = ["env_config.train_tasks_rollout_size=16", "env_config.n_samples_per_task=4", "env_config.live_view=plain"]
    small += ["policy_config.max_new_tokens=8", "algorithm.per_device_train_batch_size=2"]
    small += ["algorithm.gradient_accumulation_steps=1", "promotion.keep_last=2"]
    # a few steps that move the weights enough for vLLM's in-place reload to show (else it restarts: 45 s)
    small += ["algorithm.selection.positive_samples_to_train=8", "algorithm.learning_rate=1e-4"]
    both = ["--rl-phase", "both", "--eval-interval", "1", "--max-iterations", "2"]
    port = free_port()

    # Ctrl+C mid train rollout, then SIGTERM during the clean-up (which stops the rollout, then vLLM): the second
    # signal must not cut it short; run.sh exits with the first's code, nothing of it left
    first = start_run_sh(data, log, *both, *settings, *small, port=port)
    hold_after_next_episode(log, first, 0, VLLM_START_S + generation_s(8, 8))
    first.send_signal(signal.SIGINT)
    time.sleep(0.5)
    first.send_signal(signal.SIGTERM)
    # it stops in seconds (each group SIGTERM, SIGKILL after 10 s: docs/cli.md); 120 s only catches a clean-up
    # that does not end
    said = communicate_waiting(first, waiting_for="run.sh to stop after Ctrl+C and a SIGTERM", timeout=120)
    assert first.returncode == 130, said[-3000:]
    assert "chat template: qwen3 (default_system none)" in said, said[-4000:]
    assert not processes_mentioning(str(log), f"--port {port}") and not serves(port)
    partial = len(journal(log, "train", 1))
    assert 0 < partial < 64

    # --resume; its vLLM dies under the resumed rollout (its whole group SIGKILLed while the rollout is held after
    # its next episode, then the rollout goes on against the dead server): run.sh restarts vLLM and resumes
    resumed = start_run_sh(data, log, "--resume", *both, *settings, *small, port=port)
    hold_after_next_episode(log, resumed, partial, VLLM_START_S + generation_s(8, 8))
    signal_group(log, "vllm", signal.SIGKILL)
    signal_group(log, "rollout-train", signal.SIGCONT)
    text = communicate_waiting(resumed, waiting_for="run.sh --resume to finish both iterations", timeout=RUN_S)
    assert resumed.returncode == 0, text[-4000:]
    assert "the policy server stopped answering during the train rollout; restarting vLLM and resuming" in text
    train = journal(log, "train", 1)
    assert not [e["episode_id"] for e in train if e["status"] == "model_error"]  # the dead server failed none
    ids = [e["episode_id"] for e in train]
    assert len(ids) == len(set(ids)) == 64  # 16 tasks x 4 samples, each once across the two runs
    assert not processes_mentioning(str(log), f"--port {port}")

    # the model: a Hub id from the data path's cache, recorded; the template found from its chat template
    record = json.loads((log / "model.json").read_text())
    assert (record["wanted"], record["source"], record["reasoning"]) == (HUB_ID, "hub cache", "think")
    assert record["chat_template_kwargs"] == {"enable_thinking": False}

    for iteration in (1, 2):
        recipe = (Layout(log).training_dir(iteration) / "train_config.yaml").read_text()
        assert "template: qwen3" in recipe and "enable_thinking: false" in recipe, recipe
        update_log = Layout(log).phase_log(0, iteration, "update").read_text()
        checked = [line for line in update_log.splitlines() if "token fidelity (train, template qwen3)" in line]
        assert checked and " 0 rows checked" not in checked[0], update_log[-3000:]
        assert (Layout(log).policy_version(iteration) / "config.json").is_file()
    assert os.path.realpath(Layout(log).policy_current) == str(Layout(log).policy_version(2))
    served = [(log / "run" / "state" / f"iter_000{n}" / "serve.done").read_text().strip() for n in (1, 2)]
    assert served == ["v1 by reload", "v2 by reload"], served  # each new policy served in place

    # every prompt vLLM rendered ends in an empty reasoning block: enable_thinking false reached the server
    episodes = [e for split in ("train", "test") for n in (1, 2) for e in journal(log, split, n)]
    turns = [turn for episode in episodes for turn in episode["turns"]]
    assert turns and all(turn["prompt_token_ids"][-len(NO_THINKING) :] == NO_THINKING for turn in turns)
    assert any(len(episode["turns"]) > 1 for episode in episodes if episode["success"])  # multi-turn rows trained
    # replies cut at max_new_tokens are counted, and an episode whose last reply was cut is no success
    cut = [episode for episode in episodes if episode["turns"][-1]["finish_reason"] == "length"]
    assert cut and not any(episode["success"] for episode in cut)
    assert all(episode["info"]["truncated"] for episode in cut)
    # a rollout stopped by the signals, and the resumed one its vLLM died under, left lines of their part; the
    # last line of each rollout counts all of it (the readers', coordinator/summary.py)
    last = {
        (row["split"], row["iteration"]): row
        for row in map(json.loads, (log / "metrics.jsonl").read_text().splitlines())
        if "truncated_turns" in row
    }
    assert sum(row["truncated_turns"] for row in last.values()) == sum(t["finish_reason"] == "length" for t in turns)

    # the log path keeps its model: a --resume with another model, and a worker with another, are refused
    other = hub_snapshot(tmp_path / "other-cache", "baton-toys/other", Path(record["path"]))
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    before = (log / "model.json").read_bytes()
    worker = ["--rl-phase", "rollout", "--rollout-split", "train-only", "--num-nodes", "2", "--rank-weights", "1,1"]
    for args in (["--resume", *both], [*worker, "--worker", "1", "--max-iterations", "3"]):
        out = run_sh(
            data,
            log,
            *args,
            *[s for s in settings if "model_config.model" not in s],
            f"model_config.model={other}",
            timeout=120,
        )
        text = out.stdout + out.stderr
        assert out.returncode == 2, text[-3000:]
        assert f"this node would serve and train {other} ({other})" in text, text[-3000:]
        assert f"but this log path's model is {HUB_ID} ({record['path']})" in text, text[-3000:]
        assert "starting vLLM" not in text
    assert (log / "model.json").read_bytes() == before


VLM_ID = "baton-toys/qwen3-vl-toy"
IMAGE_PAD = 151655
#: a 320x240 screenshot is resized to multiples of 32 pixels (16-pixel patches merged 2 x 2): 320x256, 10 x 8 tokens
TOKENS_PER_SCREENSHOT = 80


@pytest.fixture(scope="module")
def toy_qwen3_vl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_toy(tmp_path_factory, "toy_vlm.py", "qwen3-vl")


def image_urls(messages: list[dict]) -> list[str]:
    parts = [p for m in messages if isinstance(m["content"], list) for p in m["content"]]
    return [p["image_url"]["url"] for p in parts if p.get("type") == "image_url"]


@pytest.mark.browser
def test_a_qwen3_vl_sees_miniwob_screenshots_and_trains_on_them(
    toy_qwen3_vl: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # served in float32 as on a CPU without native bf16: a few small steps then show in the served outputs, so that
    # vLLM reloads each new policy in place (bf16 rounds them away and the driver restarts vLLM: 100 s each)
    monkeypatch.setenv("BATON_VLLM_DTYPE", "float32")
    data, log = tmp_path / "data", tmp_path / "log"
    hub_snapshot(data / ".cache" / "huggingface" / "hub", VLM_ID, toy_qwen3_vl)
    (data / "tasks").mkdir(parents=True)
    for split, seed in (("train", 1), ("test", 2)):
        rows = build_tasks(["click-test"], 8, seed=seed)
        (data / "tasks" / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    settings = [f"model_config.model={VLM_ID}", "env=miniwob", "env.observation=both", "env.viewport=[320,240]"]
    settings += ["env.max_steps=2", "+vllm_config.limit_mm_per_prompt={image:2,video:0}"]
    settings += ["env_config.train_tasks=tasks/train.jsonl", "env_config.test_tasks=tasks/test.jsonl"]
    small = ["env_config.train_tasks_rollout_size=8", "env_config.n_samples_per_task=2", "env_config.live_view=plain"]
    small += ["policy_config.max_new_tokens=8", "algorithm.per_device_train_batch_size=2"]
    small += ["algorithm.gradient_accumulation_steps=1", "promotion.keep_last=2"]
    small += ["algorithm.selection.positive_samples_to_train=4", "algorithm.learning_rate=1e-4"]
    # one iteration and the final evaluation: the base model's rollouts, an update, v1 reloaded and evaluated
    once = ["--rl-phase", "both", "--eval-interval", "1", "--max-iterations", "1", "--final-eval"]
    out = run_sh(data, log, *once, *settings, *small, timeout=RUN_S)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert "chat template: qwen3_vl_nothink (default_system none)" in text, text[-4000:]

    # every screenshot reached vLLM: a prompt's ids hold its image tokens, at most 2 screenshots, files under the log
    episodes = journal(log, "train", 1) + journal(log, "test", 1) + journal(log, "test", 2)
    turns = [turn for episode in episodes for turn in episode["turns"]]
    shown = [image_urls(turn["messages"]) for turn in turns]
    assert turns and all(1 <= len(urls) <= 2 for urls in shown) and any(len(urls) == 2 for urls in shown)
    for turn, urls in zip(turns, shown, strict=True):
        assert turn["prompt_token_ids"].count(IMAGE_PAD) == TOKENS_PER_SCREENSHOT * len(urls)
        assert all(Path(url_path(url)).is_file() and Path(url_path(url)).is_relative_to(log) for url in urls)
        assert turn["images"] and url_path(urls[-1]).endswith(turn["images"][0]), "the page seen, by path"
    assert any(e["success"] for e in episodes) and not all(e["success"] for e in episodes)

    recipe = (Layout(log).training_dir(1) / "train_config.yaml").read_text()
    assert "template: qwen3_vl_nothink" in recipe and "image_max_pixels: 16777216" in recipe, recipe
    rows = json.loads((Layout(log).training_dir(1) / "data" / "train.json").read_text())
    assert rows and all(row["images"] and all(Path(i).is_file() for i in row["images"]) for row in rows)
    update_log = Layout(log).phase_log(0, 1, "update").read_text()
    checked = [x for x in update_log.splitlines() if "token fidelity (train, template qwen3_vl_nothink)" in x]
    assert checked and " 0 rows checked" not in checked[0], update_log[-3000:]
    assert (Layout(log).policy_version(1) / "processor_config.json").is_file()
    assert os.path.realpath(Layout(log).policy_current) == str(Layout(log).policy_version(1))
    assert text.count("reloaded") == 1 and "restarting vLLM" not in text, text[-4000:]  # served in place
    assert {e["policy_version"] for e in journal(log, "test", 2)} == {1}  # the final evaluation saw v1

    # the fidelity check refuses an image setting LLaMA-Factory would expand differently from vLLM, naming it: at
    # least 262,144 pixels, a 320x240 screenshot grows to more tokens than the model's processor gave vLLM
    recipe_path = Layout(log).training_dir(1) / "train_config.yaml"
    mismatched = tmp_path / "mismatched.yaml"
    mismatched.write_text(recipe_path.read_text().replace("image_min_pixels: 65536", "image_min_pixels: 262144"))
    check = subprocess.run(
        [env_python("train"), "-m", "training.fidelity", str(mismatched)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert check.returncode == 2, check.stdout[-2000:] + check.stderr[-3000:]
    expands = f"an image expands to {TOKENS_PER_SCREENSHOT} tokens in vLLM's prompt and"
    assert expands in check.stderr and "image_min_pixels 262144" in check.stderr, check.stderr[-3000:]

    # the dashboard's episode viewer shows each turn's screenshot beside the reply, in Chromium
    shown_images = dashboard_episode_images(log, tmp_path)
    assert shown_images and all(size == [320, 240] for size in shown_images), shown_images


def dashboard_episode_images(log: Path, tmp_path: Path) -> list[list[int]]:
    """The natural sizes of the images the dashboard shows for the first finished episode it lists, in Chromium."""
    from playwright.sync_api import sync_playwright

    from rollout_engine.envs.browser import CHROMIUM_FLAGS, find_chromium
    from tests.e2e.rollout_cli import engine_env

    chromium = find_chromium()
    assert chromium is not None, "no Chromium (set BATON_CHROMIUM)"
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    dashboard = subprocess.Popen(
        [env_python("app"), "-m", "coordinator", "dashboard", "--log-path", str(log), "--port", str(port)],
        cwd=REPO,
        env=engine_env(),
        stderr=(tmp_path / "dashboard.err").open("w"),
        start_new_session=True,
    )
    try:

        def answers() -> bool:
            try:
                with urllib.request.urlopen(url + "api/state", timeout=2):
                    return True
            except OSError:
                return False

        wait_until(answers, waiting_for=f"the dashboard to answer on {url}", timeout=START_S)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=list(CHROMIUM_FLAGS))
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url)
            page.locator('#grid .cell[data-state="done"]').first.click()
            page.wait_for_selector("#episode .turn img", timeout=30_000)
            page.wait_for_function("[...document.querySelectorAll('#episode img')].every(i => i.complete)")
            sizes = page.eval_on_selector_all(
                "#episode img", "imgs => imgs.map(i => [i.naturalWidth, i.naturalHeight])"
            )
            page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
            browser.close()
        return sizes
    finally:
        os.killpg(dashboard.pid, signal.SIGTERM)
        dashboard.wait(timeout=30)
