"""The policy server (vLLM's OpenAI server): arguments that fit the machine, a start in a recorded
process group with a deadline, reuse of only the server this run directory started, in-place weight
reloads, sleep/wake around a colocated training, and a stop of exactly that group.

    server = PolicyServer(run_dir, port=8999, name="policy", groups=groups, supervisor=supervisor,
                          serve_py=os.environ["BATON_SERVE_PY"], max_sessions=32, settings=composed.vllm)
    server.start(policy_dir)           # reuses the recorded server when it still serves policy_dir
    how = server.serve_new(new_dir)    # "reload" | "restart" | "unchanged"
    server.stop()

Its settings are vllm_config's, resolved for this node (`settings`: coordinator/driver/vllm_settings.py;
without them, vllm_config's defaults are resolved at the first start, with no media path). Its files:
`<run_dir>/serving.json`, `<run_dir>/logs/vllm.log` and the group record `vllm` in `<run_dir>/groups.json`
(with the weights it holds); its variables: BATON_DEVICE, BATON_VLLM_DTYPE, VLLM_CPU_KVCACHE_SPACE,
BATON_VLLM_START_S, BATON_VLLM_RELOAD_S. A server on the port that this run directory did not start is never
reused, reloaded or stopped. A server that exits at its start because vLLM's argument parser refused its
command line is bad input (exit 2 at once).
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from coordinator import serving
from coordinator.driver import say
from coordinator.driver.procs import Groups, group_alive
from coordinator.driver.supervise import Supervisor
from coordinator.driver.vllm_settings import ServerSettings, blame, device, for_node, refusal
from rollout_engine.config import VllmConfig
from rollout_engine.defaults import VLLM_RELOAD_S, VLLM_START_S
from rollout_engine.errors import ConfigError
from rollout_engine.files import overwrite_text

#: the name of the server's process group in <run_dir>/groups.json
GROUP = "vllm"
#: start attempts before the run ends
ATTEMPTS = 3
#: seconds the fingerprint's request (a 6-token greedy completion) may take
FINGERPRINT_S = 60.0
#: seconds a health or model-list request may take
HTTP_S = 5.0
#: seconds the health request to a server we did not start may take
FOREIGN_HTTP_S = 2.0
#: lines of vllm.log shown after a failed start
LOG_TAIL = 15
#: vLLM's OpenAI server, run as a module
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
#: the same server with its engine core forked (ServerSettings.engine_fork), run as a script in the serve environment
FORKING_SERVER = Path(__file__).resolve().parents[1] / "vllm_serve.py"
#: the server is always on loopback: a proxy from the environment (http_proxy) must not carry the requests
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _whole(variable: str, default: int, unit: str, least: int = 1) -> int:
    """The whole number >= `least` in environment variable `variable` (its default when unset or empty)."""
    text = os.environ.get(variable, "")
    if not text.strip():
        return default
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise say.Die(2, f"{variable} must be a whole number of {unit} >= {least} (got '{text}')")
    return value


def _read_from(log: Path, offset: int) -> str:
    """The text of `log` from byte `offset` on (its last 256 KiB at most; "" when it is absent)."""
    try:
        with log.open("rb") as f:
            f.seek(max(offset, f.seek(0, os.SEEK_END) - 256 * 1024))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _tail(log: Path, lines: int = LOG_TAIL) -> None:
    """Print the last `lines` lines of `log` to stderr (as `tail -n` does; nothing when it is absent)."""
    text = _read_from(log, 0)
    for line in text.splitlines()[-lines:]:
        print(line, file=sys.stderr)
    sys.stderr.flush()


@dataclass
class PolicyServer:
    """This node's vLLM: served as `name` on 127.0.0.1:`port`, recorded under `run_dir` as group "vllm"."""

    run_dir: Path
    port: int
    name: str
    groups: Groups
    supervisor: Supervisor
    #: BATON_SERVE_PY: the serve environment's interpreter
    serve_py: str
    #: VLLM_MAX_SESSIONS (the composed max_vllm_sessions): requests the CPU KV cache holds at full length
    max_sessions: int = 32
    #: vllm_config resolved for this node (run.compose); None: vllm_config's defaults (no media path), resolved
    #: by `choose`
    settings: ServerSettings | None = None
    #: seconds between polls while the server starts (each poll ticks the supervisor's watches)
    poll_s: float = 1.0
    #: the serving dtype, and the CPU KV cache in GiB (set by choose)
    dtype: str = field(default="", init=False)
    kv_gib: int | None = field(default=None, init=False)
    #: the fingerprint of the weights served now, taken when they started serving ("" when not known): a
    #: reload compares against it instead of asking again. vLLM's first request with logprobs costs seconds
    #: (2.6 s against 0.4 s on a 2-core CPU): paid at start-up, not while a new policy waits to go live.
    served_fingerprint: str = field(default="", init=False)

    @property
    def log(self) -> Path:
        return Path(self.run_dir) / "logs" / "vllm.log"

    def _url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _get(self, path: str, timeout: float) -> bytes | None:
        """The body of a GET of `path` that answered 2xx; None otherwise (curl -f)."""
        try:
            with _OPENER.open(self._url(path), timeout=timeout) as response:
                return response.read()
        except (OSError, http.client.HTTPException):
            return None

    def _post(self, path: str, body: object = None) -> bytes | None:
        """POST to the server's dev endpoint `path` (JSON `body`, when given), waiting at most
        BATON_VLLM_RELOAD_S seconds for the answer; its body when 2xx, else None."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if body is not None else {}
        request = urllib.request.Request(self._url(path), data=data, headers=headers, method="POST")

        def send() -> bytes | None:
            try:
                with _OPENER.open(request, timeout=VLLM_RELOAD_S.value()) as response:
                    return response.read()
            except (OSError, http.client.HTTPException):
                return None

        # A reload or a wake-up may take minutes: the run's watches (its heartbeat) tick meanwhile.
        return self.supervisor.call(send)

    def choose(self, model: str, record: bool = True) -> tuple[str, int]:
        """Pick the serving dtype and the CPU KV-cache size for this machine (coordinator/serving.py),
        say so, and (when `record`) save the choice to <run_dir>/serving.json. The KV cache holds
        max_sessions requests of the full model length at once (each vLLM worker its share), unless
        VLLM_CPU_KVCACHE_SPACE is set. Die(2) on a bad BATON_VLLM_DTYPE, a model config that cannot size the
        cache, or (without `settings`) vllm_config's defaults that do not fit this node."""
        if self.settings is None:  # no run.sh (bench/, tests): its defaults, with no media path (no log path known)
            try:
                self.settings = for_node(VllmConfig(allowed_local_media_path=""), Path(model), "")
            except ConfigError as exc:
                raise say.Die(2, "; ".join(exc.problems)) from exc
        s = self.settings
        forced = os.environ.get("BATON_VLLM_DTYPE", "")
        try:
            plan = serving.serving_plan(
                s.device,
                Path(model),
                self.max_sessions,
                s.max_model_len,
                forced=forced,
                tensor_parallel=s.tensor_parallel_size,
                data_parallel=s.data_parallel_size,
            )
        except ValueError as exc:
            raise say.Die(2, str(exc)) from exc
        if record:
            record_text = json.dumps(plan.record(), indent=2, sort_keys=True) + "\n"
            overwrite_text(Path(self.run_dir) / "serving.json", record_text)  # one create at a node's start
        self.dtype = plan.precision.dtype
        self.kv_gib = _whole("VLLM_CPU_KVCACHE_SPACE", plan.kv_cache_gib, "GiB", least=0)
        if s.device == "cuda":
            say.log(f"serving {self.dtype}: {plan.precision.reason}")
        else:
            each = f" each of {s.workers} workers" if s.workers > 1 else ""
            say.log(
                f"serving {self.dtype}: {plan.precision.reason}; KV cache {self.kv_gib} GiB{each} for "
                f"{self.max_sessions} requests of {s.max_model_len} tokens"
            )
        return self.dtype, self.kv_gib

    def entry(self) -> list[str]:
        """What the serve interpreter runs: vLLM's server module, or coordinator/vllm_serve.py where the engine
        core is forked (`settings.engine_fork`). Call after `choose`."""
        assert self.settings is not None, "PolicyServer.entry needs its settings: call choose first"
        return [str(FORKING_SERVER)] if self.settings.engine_fork else ["-m", SERVER_MODULE]

    def args(self, model: str) -> list[str]:
        """The server's arguments for this machine (CPU: eager mode; GPU: sleep mode), in the dtype `choose`
        picked (bfloat16 before it), then vllm_config's (the context, the parallel sizes, ...; extra_args
        last): what follows `entry()` on the command line. Call after `choose`."""
        assert self.settings is not None, "PolicyServer.args needs its settings: call choose first"
        args = ["--model", model, "--served-model-name", self.name]
        args += ["--host", "127.0.0.1", "--port", str(self.port)]
        args += ["--dtype", self.dtype or "bfloat16", "--generation-config", "vllm"]
        args += ["--enable-sleep-mode"] if self.settings.device == "cuda" else ["--enforce-eager"]
        return args + self.settings.args()

    def command(self, model: str, entry: list[str] | None = None) -> list[str]:
        """The whole command line of the server (after `choose`): dev mode for the in-place reloads. `entry`
        replaces what the interpreter runs (default `entry()`), as the dry run's check of the arguments does."""
        kv = "" if self.kv_gib is None else str(self.kv_gib)
        assert self.settings is not None, "PolicyServer.command needs its settings: call choose first"
        env = ["VLLM_SERVER_DEV_MODE=1", f"VLLM_CPU_KVCACHE_SPACE={kv}"]
        env += [f"{k}={v}" for k, v in self.settings.env().items()]
        return ["env", *env, self.serve_py, *(self.entry() if entry is None else entry), *self.args(model)]

    def refused(self, output: str) -> say.Die | None:
        """The bad-input error for a start whose `output` shows vLLM's argument parser refusing the command
        line (None otherwise): vLLM's words and the setting to fix."""
        message = refusal(output)
        if message is None or self.settings is None:
            return None
        return say.Die(
            2,
            f"vLLM refused its command line: {message}; set {blame(message, self.settings)} to what vLLM takes "
            "(docs/serving.md; run.sh --dry-run checks the command line with vLLM's parser)",
        )

    def answers(self) -> bool:
        """Something answers the health check on the port (ours or not)."""
        return self._get("/health", FOREIGN_HTTP_S) is not None

    def serves(self, model: str | None = None) -> bool:
        """A healthy server on the port serves `name` (from the folder `model`, when given)."""
        if self._get("/health", HTTP_S) is None:
            return False
        body = self._get("/v1/models", HTTP_S)
        try:
            listed = json.loads(body or b"").get("data") or []
        except (ValueError, AttributeError):
            return False
        return any(
            isinstance(entry, dict) and entry.get("id") == self.name and (not model or entry.get("root") == model)
            for entry in listed
        )

    def reuse(self, model: str | None = None) -> bool:
        """Keep the server this run directory recorded when its leader still runs (same start time), its
        group holds the port and it answers there with `name` (from `model`, when given). Otherwise stop
        it (a record whose pid now names another process is only forgotten) and return False, so that
        the caller starts a new one."""
        record = self.groups.recorded(GROUP)
        if record is None:
            return False
        if not self.groups.leader_alive(GROUP):
            self.groups.stop_stale(GROUP)
            return False
        source = f" from {model}" if model else ""
        if self.groups.listens(GROUP, self.port) and self.serves(model):
            say.log(
                f"vLLM on port {self.port} (group {record[0]}, started by this run) already serves "
                f"{self.name}{source}; reusing it"
            )
            return True
        say.warn(
            f"the vLLM this run started (group {record[0]}) does not serve {self.name}{source} on port "
            f"{self.port}; restarting it"
        )
        self.groups.stop(GROUP, 10)
        return False

    def _wait(self, deadline_s: float) -> int:
        """Wait until the server we started answers (0); 1 past the deadline; 2 at once when its process
        group is gone. Each poll ticks the supervisor's watches (which may end the wait by raising)."""
        record = self.groups.recorded(GROUP)
        if record is None:
            return 2
        began = time.monotonic()
        while time.monotonic() - began < deadline_s:
            if self.serves():
                return 0
            if not group_alive(record[0]):
                return 2
            self.supervisor.tick()
            time.sleep(self.poll_s)
        return 1

    def start(self, model: str, deadline_s: float | None = None) -> None:
        """Serve the folder `model`: reuse the recorded server if it still serves it on the port (reuse),
        else start one (up to 3 attempts, each given `deadline_s` seconds to answer; default
        BATON_VLLM_START_S) and wait for it, its output in <run_dir>/logs/vllm.log. Die(1) when the port
        is held by a server this run did not start, or after 3 failed attempts; Die(2) when no way to
        serve fits (choose), or at the first attempt that vLLM's argument parser refuses (`refused`). A
        watch that raises during the wait leaves the group recorded, for the run's clean-up to stop."""
        deadline = VLLM_START_S.value() if deadline_s is None else deadline_s
        if self.reuse(model):
            return
        if self.answers():
            raise say.Die(
                1,
                f"port {self.port} is held by a server that this run did not start; stop it or choose another "
                "port (BATON_VLLM_PORT), or use it with --debug-mode",
            )
        self.log.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.choose(model)
            cmd = self.command(model)
        except say.Die as exc:
            for line in say.error_lines(exc):
                print(line, file=sys.stderr, flush=True)
            raise say.Die(exc.code, f"cannot choose how to serve {model} (message above)") from exc
        for attempt in range(1, ATTEMPTS + 1):
            say.log(
                f"starting vLLM ({self.name} from {model}, port {self.port}, attempt {attempt}/{ATTEMPTS}, "
                f"log: {self.log})"
            )
            offset = _size(self.log)
            job = self.groups.start(GROUP, cmd, self.log)
            began = time.monotonic()
            code = self._wait(deadline)
            if code == 0:
                say.log(f"vLLM ready on port {self.port}")
                self.record_weights(model)
                self.served_fingerprint = self.fingerprint()
                return
            refused = self.refused(_read_from(self.log, offset)) if code == 2 and job.poll() == 2 else None
            if refused is not None:
                self.groups.stop(GROUP, 10)
                raise refused
            if code == 2:
                seconds = int(time.monotonic() - began)
                say.warn(f"vLLM exited during its start-up (after {seconds}s); last lines of {self.log}:")
            else:
                say.warn(
                    f"vLLM did not become healthy within {deadline:g}s (BATON_VLLM_START_S); last lines of {self.log}:"
                )
            _tail(self.log)
            self.groups.stop(GROUP, 10)
        raise say.Die(1, f"vLLM failed to start {ATTEMPTS} times; see {self.log}")

    def stop(self, grace_s: float = 30) -> None:
        """Stop the server this run started (nothing else); forget which weights it held."""
        self.groups.stop(GROUP, grace_s)  # its record goes, and with it the weights it held
        self.served_fingerprint = ""

    def recorded_weights(self) -> str:
        """The weights the recorded server holds ("" when unknown)."""
        return self.groups.holds(GROUP)

    def record_weights(self, model: str) -> None:
        """Note which weights the recorded server holds now (after a start or an in-place reload), so that
        a later run that reuses the server knows: on its group's record, which is rewritten in place and goes when
        the server stops (no name of its own on the shared path)."""
        self.groups.note(GROUP, model)

    def reload(self, model: str) -> bool:
        """Load `model`'s weights into the running server without a restart (needs VLLM_SERVER_DEV_MODE=1,
        which `command` sets), then drop the prefix cache and the multimodal encoder caches computed with the old
        weights. False when vLLM refuses any, or says the prefix cache was not dropped ({"success":false}: blocks
        still held)."""
        body = {"method": "reload_weights", "kwargs": {"weights_path": model}}
        if self._post("/collective_rpc", body) is None:
            return False
        reset = self._post("/reset_prefix_cache")
        try:
            if reset is None or json.loads(reset).get("success") is not True:
                return False
        except (ValueError, AttributeError):
            return False
        # a vision-language model's encoder outputs (and the scheduler's record of them) belong to the old weights:
        # kept, the next request with an image seen before dies on "Encoder cache miss" (and the engine with it)
        return all(self._post(path) is not None for path in ("/reset_encoder_cache", "/reset_mm_cache"))

    def sleep(self) -> bool:
        """Free the accelerator's memory for a colocated training (a no-op on CPU)."""
        return device() != "cuda" or self._post("/sleep?level=1") is not None

    def wake(self) -> bool:
        """Undo `sleep` (a no-op on CPU)."""
        return device() != "cuda" or self._post("/wake_up") is not None

    def fingerprint(self) -> str:
        """The greedy tokens and logprobs of a fixed prompt (they identify the served weights); "" when
        the server gives none."""
        base_url = f"http://127.0.0.1:{self.port}/v1"
        try:
            # a loaded server may take the whole timeout: the run's watches (its heartbeat) tick meanwhile
            return self.supervisor.call(lambda: serving.fingerprint(base_url, self.name, FINGERPRINT_S))
        except OSError as exc:
            say.warn(
                f"no fingerprint from {base_url}: {exc}; the run goes on (a restart, not an in-place reload, will "
                "serve the next policy if the server stays silent)"
            )
        except (ValueError, LookupError, TypeError):
            pass
        return ""

    def serve_new(self, model: str) -> str:
        """Serve `model` in place of the current weights: an in-place reload when the fingerprint changes,
        else (reload refused, no visible change, or a folder that cannot be reloaded exactly) a restart.
        Returns "reload", "restart", or "unchanged" when even a restart serves the same outputs (the
        update did not move the weights at served precision)."""
        began = time.monotonic()
        before = self.served_fingerprint or self.fingerprint()
        try:
            why = serving.reload_blocker(Path(model))
        except Exception:  # an unreadable folder: restart, without a reason
            why = ""
        if why is not None:
            say.warn(
                f"{why or f'{model} cannot be reloaded in place'}; restarting vLLM on it (an in-place reload "
                "would keep the old output head)"
            )
        elif self.reload(model):
            after = self.fingerprint()
            if after and after != before:
                say.log(f"vLLM reloaded {model} in place in {time.monotonic() - began:.1f}s (served outputs changed)")
                self.record_weights(model)
                self.served_fingerprint = after
                return "reload"
            say.warn(f"in-place reload left the served outputs unchanged; restarting vLLM on {model} to make sure")
        else:
            say.warn(f"in-place reload is unavailable on port {self.port}; restarting vLLM on {model}")
        self.stop()
        self.start(model)
        after = self.served_fingerprint
        if before and after == before:
            say.warn(
                f"the new policy {model} gives the same greedy outputs as the old one (an update too small to show)"
            )
            return "unchanged"
        return "restart"
