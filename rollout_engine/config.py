"""Hydra structured configs of the rollout engine, and their validation.

Schemas are dataclasses registered in Hydra's ConfigStore by
`register_configs()` (called by the entry point, never at import). YAML under
`configs/` only sets values: `configs/rollout_train.yaml` and
`configs/rollout_test.yaml` start from the `rollout_schema` node and pick an
environment from the config group `env` (`configs/env/<name>.yaml`).

Sections: `model_config` (the policy's model; the update config holds it too),
`policy_config` (the model server; `PolicyConfig` is reused by
training), `vllm_config` (how run.sh starts vLLM on each node: docs/serving.md),
`env_config` (scheduling, tasks, sampling, budgets),
`openai_config` (the LLM judge) and run-level keys (`data_path`, `log_path`,
`split`, `iteration`, `rank`, `rank_weights`, `resume`, `seed`, ...).

The `env` node is `_target_` plus that environment's parameters. The engine
builds the environment in two steps (see `rollout_engine.build.build_env`):

    factory = hydra.utils.instantiate(cfg.env, _partial_=True)
    env = factory(context=RunContext(...))

so every environment class takes its YAML parameters as keyword arguments plus
one `context: RunContext` (split, iteration, rank, seed, log and image
directories, step budgets, judge settings). Constructors only check and store
values (raise `ConfigError` naming `env.<key>`); expensive work goes in
`Env.start()`.

Checks: every numeric setting's range and every enum's choices are declared
beside the setting (`setting(default, Range(...) | Choice(...))`,
rollout_engine.schema); other single-field checks in each section's
`__post_init__`; `validate(cfg)` runs both and the cross-field checks and
collects every problem of every section into one error. Bad input exits 2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rollout_engine import schema as _schema
from rollout_engine.errors import ConfigError
from rollout_engine.schema import Choice, Range, setting

SPLITS = ("train", "test")
SAMPLERS = ("uniform", "ratio", "learnable")
LIVE_VIEWS = ("auto", "rich", "plain", "off")
CONSTRAIN_VERDICT = ("auto", "regex", "none")
LIMITS_SCOPES = ("node", "cluster")
#: more tokens than any model's context: a value above it is a typo
MAX_TOKENS = 1 << 20
#: seeds are unsigned 32-bit (numpy's, and so the trainer's)
MAX_SEED = (1 << 32) - 1
#: tokens of vllm_config.max_model_len that policy_config.max_new_tokens must leave for the prompt (a chat
#: template, a system prompt and a short task take a few hundred)
PROMPT_ROOM = 256


def cluster_limit_problem(name: str, total: int, weights: list[float]) -> str:
    """The error for a cluster-wide limit too small to give each rank with weight > 0 at least 1 ("" if fine)."""
    active = sum(1 for w in weights if w > 0)
    if total >= active:
        return ""
    return (
        f"env_config.{name} must be >= {active} with env_config.limits_scope=cluster (got {total}): "
        f"each of the {active} ranks with weight > 0 needs at least 1; raise it, or use "
        "env_config.limits_scope=node (the value is then each node's own limit)"
    )


def _check(problems: list[str], ok: bool, message: str) -> None:
    if not ok:
        problems.append(message)


def _raise(problems: list[str]) -> None:
    if problems:
        raise ConfigError(problems)


@dataclass
class PolicyConfig:
    """The OpenAI-compatible policy server (vLLM) and its sampling settings."""

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "policy"
    #: name of the environment variable holding the API key; "" or unset sends "EMPTY" (vLLM needs none)
    api_key_env: str = "BATON_POLICY_API_KEY"
    temperature: float = setting(1.0, Range(0, 10))
    top_p: float = setting(1.0, Range(0, 1, low_open=True))
    #: -1 disables top-k (sent to vLLM only when > 0)
    top_k: int = setting(-1, Range(low=1, special={-1: "off"}))
    max_new_tokens: int = setting(256, Range(1, MAX_TOKENS))
    #: seconds per request, connect included
    request_timeout_s: float = setting(120.0, Range(low=0, low_open=True, unit="seconds"))
    #: retries after the first attempt on connection errors, timeouts, 429 and 5xx: a request is sent at most
    #: max_retries + 1 times (then one health probe tells a dead server from a failed request)
    max_retries: int = setting(3, Range(low=0))
    #: first backoff in seconds; doubles per retry up to retry_backoff_max_s
    retry_backoff_s: float = setting(0.5, Range(low=0, unit="seconds"))
    retry_backoff_max_s: float = setting(8.0, Range(low=0, unit="seconds"))
    #: ask vLLM for prompt and completion token ids (`return_token_ids`)
    return_token_ids: bool = True
    #: also ask for each sampled token's log-probability (chat completions `logprobs`, `top_logprobs` 0) and keep
    #: them beside the ids (Turn.completion_logprobs): what a policy-gradient update's importance ratio needs.
    #: Costs about 10 bytes of journal per reply token (docs/rollout.md)
    return_logprobs: bool = True

    def __post_init__(self) -> None:
        p: list[str] = []
        _check(
            p,
            self.return_token_ids or not self.return_logprobs,
            "policy_config.return_logprobs needs policy_config.return_token_ids=true (got return_token_ids=false): "
            "the log-probabilities are kept aligned with the token ids; set return_logprobs=false too",
        )
        _check(
            p,
            self.base_url.startswith(("http://", "https://")),
            f"policy_config.base_url must start with http:// or https:// (got {self.base_url!r}); "
            "set it to the server's OpenAI URL, e.g. http://127.0.0.1:8000/v1",
        )
        _check(
            p,
            bool(self.model),
            "policy_config.model must be the served model name (got ''); set it to the server's --served-model-name",
        )
        _check(
            p,
            self.retry_backoff_max_s >= self.retry_backoff_s,
            f"policy_config.retry_backoff_s must be <= retry_backoff_max_s "
            f"(got {self.retry_backoff_s} and {self.retry_backoff_max_s})",
        )
        _raise(p)


#: vLLM's flags that a setting or run.sh sets (vllm_config.extra_args may not): the flag as vLLM spells it (an
#: underscore for a dash, `=value` or `.key` after it, are the same flag) -> what sets it
VLLM_OWNED_FLAGS = {
    "--max-model-len": "vllm_config.max_model_len",
    "--tensor-parallel-size": "vllm_config.tensor_parallel_size",
    "-tp": "vllm_config.tensor_parallel_size",
    "--data-parallel-size": "vllm_config.data_parallel_size",
    "-dp": "vllm_config.data_parallel_size",
    "--gpu-memory-utilization": "vllm_config.gpu_memory_utilization",
    "--device-memory-utilization": "vllm_config.gpu_memory_utilization",
    "--limit-mm-per-prompt": "vllm_config.limit_mm_per_prompt",
    "--allowed-local-media-path": "vllm_config.allowed_local_media_path",
    "--model": "run.sh (the base model, then each promoted policy)",
    "--served-model-name": "policy_config.model",
    "--host": "run.sh (vLLM listens on 127.0.0.1 only)",
    "--port": "BATON_VLLM_PORT",
    "--dtype": "BATON_VLLM_DTYPE",
    "--generation-config": "run.sh (vllm: policy_config's sampling settings are the ones used)",
    "--enable-sleep-mode": "run.sh (on a GPU: vLLM sleeps while a colocated update trains)",
    "--no-enable-sleep-mode": "run.sh (on a GPU: vLLM sleeps while a colocated update trains)",
}
#: the variables that set vLLM's context and memory share before vllm_config did: run.sh refuses them
REMOVED_VARIABLES = {
    "VLLM_MAX_MODEL_LEN": "vllm_config.max_model_len",
    "VLLM_GPU_MEMORY_UTILIZATION": "vllm_config.gpu_memory_utilization",
}


def vllm_flag(arg: str) -> str:
    """The flag an element of vllm_config.extra_args names, as vLLM spells it ("" for a value):
    `--max_model_len=4096` -> `--max-model-len`, `--limit-mm-per-prompt.video` -> `--limit-mm-per-prompt`."""
    if not arg.startswith("-") or arg.lstrip("-")[:1].isdigit():
        return ""
    dashes = "--" if arg.startswith("--") else "-"
    name = arg[len(dashes) :].split("=", 1)[0].split(".", 1)[0]
    return dashes + name.replace("_", "-")


def removed_variable_problem(name: str) -> str:
    """The error for a removed variable that is set ("" for any other name)."""
    setting = REMOVED_VARIABLES.get(name)
    if setting is None:
        return ""
    return (
        f"{name} is no longer read: vLLM's settings are vllm_config's now; unset it and pass {setting}=VALUE "
        "(or set it in a node group's vllm_config; docs/serving.md)"
    )


def prompt_room_problem(max_new_tokens: int, max_model_len: int, how: str = "") -> str:
    """The error when policy_config.max_new_tokens leaves under PROMPT_ROOM tokens of the context for the
    prompt ("" when it leaves enough); `how` says how an auto context was chosen."""
    if max_new_tokens + PROMPT_ROOM <= max_model_len:
        return ""
    lower = max_model_len - PROMPT_ROOM
    fix = f"lower policy_config.max_new_tokens to <= {lower}, or " if lower >= 1 else ""
    return (
        f"policy_config.max_new_tokens must leave at least {PROMPT_ROOM} tokens of vllm_config.max_model_len for "
        f"the prompt (got {max_new_tokens} of {max_model_len}{how}); {fix}raise vllm_config.max_model_len to >= "
        f"{max_new_tokens + PROMPT_ROOM}"
    )


@dataclass
class VllmConfig:
    """How run.sh starts vLLM, the policy server, on each node (docs/serving.md). The auto values are
    resolved per node (coordinator/driver/vllm_settings.py); a node file's group overrides any of these
    for its ranks (`vllm_config:` in docs/multinode.md, node groups)."""

    #: the context in tokens (prompt and reply); 0 = auto: the model's own (max_position_embeddings of its
    #: config.json), at most 2048 on a CPU (whose KV cache is sized for max_vllm_sessions requests of this
    #: length) and 32768 on a GPU
    max_model_len: int = setting(0, Range(low=1, high=MAX_TOKENS, special={0: "auto"}, unit="tokens"))
    #: GPUs (CPU: NUMA nodes) that hold one copy of the model
    tensor_parallel_size: int = setting(1, Range(low=1))
    #: copies of the model on this node; 0 = auto: the node's GPUs / tensor_parallel_size (1 on a CPU)
    data_parallel_size: int = setting(0, Range(low=1, special={0: "auto"}))
    #: the share of each GPU's memory vLLM takes (unused on a CPU: its KV cache is VLLM_CPU_KVCACHE_SPACE)
    gpu_memory_utilization: float = setting(0.85, Range(0, 1, low_open=True))
    #: items of each modality one prompt may hold ({video: 0, image: 4}); {} = vLLM's defaults
    limit_mm_per_prompt: dict[str, int] = field(default_factory=dict)
    #: the folder whose files requests may name (file:// image URLs); auto = the run's --log-path, where the
    #: environments keep their screenshots; "" = none
    allowed_local_media_path: str = "auto"
    #: any other argument of vLLM's server, verbatim, after Baton's ([--max-num-seqs, 512])
    extra_args: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        p: list[str] = []
        for modality, limit in self.limit_mm_per_prompt.items():
            _check(p, limit >= 0, f"vllm_config.limit_mm_per_prompt.{modality} must be >= 0 (got {limit})")
        path = self.allowed_local_media_path
        _check(
            p,
            path in ("auto", "") or path.startswith("/"),
            f"vllm_config.allowed_local_media_path must be auto, '' or an absolute path (got {path!r}); "
            "auto is the run's --log-path",
        )
        for arg in self.extra_args:
            flag = vllm_flag(arg)
            owner = VLLM_OWNED_FLAGS.get(flag, "")
            fix = f"{owner} sets it; drop it" if owner.startswith("run.sh") else f"set {owner} instead"
            _check(p, not owner, f"vllm_config.extra_args must not set {flag} (got {arg!r}): {fix}")
        _raise(p)


def vllm_config_problems(values: Mapping[str, Any]) -> list[str]:
    """What is wrong with `values` as vllm_config settings (a node file group's): a key that is no setting, a
    value of the wrong type or outside its rule; [] when nothing is. Each problem names vllm_config.<key>."""
    known = [f.name for f in dataclasses.fields(VllmConfig)]
    unknown = sorted(str(k) for k in values if k not in known)
    if unknown:
        return [f"vllm_config has no settings {unknown}; known: {', '.join(known)}"]
    problems, merged = [], OmegaConf.structured(VllmConfig)
    for key, value in values.items():
        try:
            merged = OmegaConf.merge(merged, {key: value})
        except OmegaConfBaseException as exc:
            why = str(exc).splitlines()[0]
            problems.append(f"vllm_config.{key} cannot be {value!r} ({why}); give it a value of its type")
    problems += _schema.problems(merged, "vllm_config")
    try:
        OmegaConf.to_object(merged)
    except ConfigError as exc:
        problems += exc.problems
    return problems


#: the reference system's model names (model_config.model_type) and the Hub models they stand for
MODEL_TYPES = {"qwen3-instruct": "Qwen/Qwen3-VL-8B-Instruct", "qwen3-think": "Qwen/Qwen3-VL-8B-Thinking"}
REASONING = ("auto", "think", "none")


@dataclass
class ModelConfig:
    """The policy's model: what every node serves and trains (the rollout and the update configs both hold it,
    so an override reaches both). run.sh resolves it once, records it in the run and pins it across nodes and
    --resume (docs/models.md)."""

    #: a Hugging Face model folder or a Hub id ("Qwen/Qwen3-8B", found in <data_path>/.cache/huggingface);
    #: "" = the shipped model, <data_path>/models/SmolLM2-135M-Instruct
    model: str = ""
    #: the reference system's names, an alternative to `model`: qwen3-instruct or qwen3-think ("" = none)
    model_type: str = setting("", Choice(("", *MODEL_TYPES), "the reference's Qwen3-VL-8B Instruct / Thinking"))
    #: LLaMA-Factory's template for the training rows: auto = the one that renders the model's own chat
    #: template token for token (found before anything starts)
    template: str = "auto"
    #: the system prompt LLaMA-Factory inserts when a row has none: auto = the one the model's chat template
    #: inserts (found with the template); null = the template's own
    default_system: str | None = "auto"
    #: chat template arguments (enable_thinking: false), sent with every request and used when the training
    #: rows are rendered
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    #: replies carry reasoning before the action: think (<think>...</think>, kept in the trajectory and trained,
    #: never shown to the environment), none, or auto (think when the model's chat template knows the tags)
    reasoning: str = setting("auto", Choice(REASONING))

    def __post_init__(self) -> None:
        p: list[str] = []
        _check(
            p,
            not (self.model and self.model_type),
            f"model_config.model and model_config.model_type are both set (got {self.model!r} and "
            f"{self.model_type!r}); set one of them",
        )
        _raise(p)

    @property
    def wanted(self) -> str:
        """The model asked for: `model`, the Hub id of `model_type`, or "" for the shipped model."""
        return self.model or MODEL_TYPES.get(self.model_type, "")


@dataclass
class StepBudget:
    """WebGym's difficulty buckets: 1-3 easy, 4-6 medium, 7+ hard."""

    easy: int = setting(10, Range(low=1))
    medium: int = setting(20, Range(low=1))
    hard: int = setting(30, Range(low=1))

    def for_difficulty(self, difficulty: int) -> int:
        return self.easy if difficulty <= 3 else self.medium if difficulty <= 6 else self.hard


@dataclass
class DifficultyBucket:
    """One bucket of the `ratio` sampler: difficulties low..high (inclusive), relative weight."""

    low: int = setting(1, Range(low=1))
    high: int = setting(3, Range(low=1))
    weight: float = setting(1.0, Range(low=0))


@dataclass
class EnvConfig:
    """Scheduling, tasks, sampling and budgets of one rollout."""

    #: environment slots (browsers contexts, games) live at once on each node (limits_scope=node)
    server_size: int = setting(8, Range(low=1))
    #: model requests in flight at once on each node (limits_scope=node)
    max_vllm_sessions: int = setting(16, Range(low=1))
    #: node: server_size and max_vllm_sessions are each node's own limits (its own vLLM and environments);
    #: cluster: they are cluster totals, shared among the ranks by rank_weights
    limits_scope: str = setting(
        "node",
        Choice(
            LIMITS_SCOPES,
            "node: server_size and max_vllm_sessions are per node, cluster: totals shared by rank_weights",
        ),
    )
    n_samples_per_task: int = setting(1, Range(low=1))
    #: task files, relative to data_path unless absolute
    train_tasks: str = "tasks/train.jsonl"
    test_tasks: str = "tasks/test.jsonl"
    #: folders that hold the package of an environment of your own (env._target_=my_envs.guess.GuessNumberEnv:
    #: the folder with my_envs/ in it), put on the import path of the driver's checks and of every rollout
    #: before the environment is built (after the repository, before the installed packages); relative to
    #: data_path unless absolute. [] = the repository, PYTHONPATH and the app environment's packages only
    python_path: list[str] = field(default_factory=list)
    train_tasks_rollout_size: int = setting(64, Range(low=0, note="0 = every task"))
    #: -1 or 0: every test task
    test_tasks_rollout_size: int = setting(-1, Range(low=0, special={-1: "all"}))
    test_tasks_repeat_times: int = setting(1, Range(low=1))
    #: held-out (test) rollouts sample greedily, one sample per task (temperature 0): the policy's
    #: deterministic score, without sampling noise (n_samples_per_task and repeats apply to train only)
    test_greedy: bool = False
    train_tasks_sampler: str = setting("uniform", Choice(SAMPLERS))
    difficulty_ratio: dict[str, DifficultyBucket] = field(default_factory=dict)
    #: the `learnable` sampler's history: the train rollouts of this many iterations before this one
    learnable_window: int = setting(2, Range(low=1))
    #: submit the hardest tasks first (WebGym does)
    hardest_first: bool = True
    #: wall-clock limit of one episode attempt, in seconds
    episode_timeout_s: float = setting(600.0, Range(low=0, low_open=True, unit="seconds"))
    #: re-runs of one episode after an infrastructure failure
    infra_retries: int = setting(1, Range(low=0))
    #: re-runs allowed in the whole rollout, across episodes
    infra_retry_budget: int = setting(16, Range(low=0))
    train_difficulty_max_steps: StepBudget = field(default_factory=lambda: StepBudget(10, 20, 30))
    test_difficulty_max_steps: StepBudget = field(default_factory=lambda: StepBudget(30, 50, 70))
    #: auto (rich on a TTY, else a plain line), rich, plain or off
    live_view: str = setting("auto", Choice(LIVE_VIEWS))
    #: seconds between status.json snapshots
    status_interval_s: float = setting(1.0, Range(low=0, low_open=True, unit="seconds"))

    def __post_init__(self) -> None:
        p: list[str] = []
        for index, folder in enumerate(self.python_path):
            _check(
                p,
                bool(folder.strip()),
                f"env_config.python_path[{index}] must name a folder (got {folder!r}); remove it or give the "
                "folder that holds your environment's package",
            )
        for name, bucket in self.difficulty_ratio.items():
            _check(
                p,
                bucket.low <= bucket.high,
                f"env_config.difficulty_ratio.{name} needs low <= high (got low={bucket.low}, high={bucket.high}); "
                "swap them",
            )
        _raise(p)

    def step_budget(self, split: str) -> StepBudget:
        return self.train_difficulty_max_steps if split == "train" else self.test_difficulty_max_steps


@dataclass
class JudgeOverride:
    """Per-purpose judge settings; None keeps the value of `openai_config`."""

    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None


@dataclass
class OpenAIConfig:
    """The LLM judge behind any OpenAI-compatible endpoint.

    Empty `base_url` / `model` reuse `policy_config` (a local vLLM judging
    itself); `api_key_env` "" sends no key, otherwise the named variable must
    be set.
    """

    base_url: str = ""
    model: str = ""
    api_key_env: str = ""
    temperature: float = setting(0.0, Range(0, 10))
    max_tokens: int = setting(256, Range(1, MAX_TOKENS))
    #: seconds per request, connect included
    request_timeout_s: float = setting(60.0, Range(low=0, low_open=True, unit="seconds"))
    #: retries after the first request of a judgement, for connection errors, timeouts, 429, 5xx and unparseable
    #: replies alike: a judgement sends at most max_retries + 1 requests
    max_retries: int = setting(3, Range(low=0))
    #: first backoff in seconds; doubles per retry up to 8 s (or retry_backoff_s when larger)
    retry_backoff_s: float = setting(0.5, Range(low=0, unit="seconds"))
    #: constrain the judge's decoding to a reply ending in the verdict line: `regex` (vLLM's structured outputs,
    #: the reply is always parseable), `none` (an endpoint without them), `auto` (regex when the judge is the
    #: policy server, a vLLM of ours; none for another endpoint)
    constrain_verdict: str = setting("auto", Choice(CONSTRAIN_VERDICT))
    #: override for the answer-evaluation calls
    evaluation: JudgeOverride = field(default_factory=JudgeOverride)

    def __post_init__(self) -> None:
        p: list[str] = []
        for key, url in (("base_url", self.base_url), ("evaluation.base_url", self.evaluation.base_url)):
            _check(
                p,
                not url or url.startswith(("http://", "https://")),
                f"openai_config.{key} must be empty or start with http:// or https:// (got {url!r})",
            )
        _raise(p)


@dataclass
class RolloutConfig:
    """One rollout: one (split, iteration) on one rank."""

    data_path: str = MISSING
    log_path: str = MISSING
    split: str = setting("train", Choice(SPLITS))
    iteration: int = setting(0, Range(low=0))
    rank: int = setting(0, Range(low=0))
    #: one load weight per rank; this rank's share of tasks and limits is rank_weights[rank] / sum
    rank_weights: list[float] = field(default_factory=lambda: [1.0])
    #: continue this iteration's journal instead of moving it aside
    resume: bool = False
    #: the run seed; sampling uses a seed derived from (seed, iteration, split)
    seed: int = setting(0, Range(0, MAX_SEED))
    #: recorded on every trajectory (the policy/v<NNNN> being served), if known
    policy_version: int | None = setting(None, Range(low=0))
    #: a takeover.json (relative paths are under log_path): roll out the dead ranks' episodes it assigns to
    #: this rank, each into rank_<r>.takeover_<d>.jsonl, instead of this rank's own share
    #: (--on-rank-failure continue: rollout_engine.takeover); "" rolls out the own share
    takeover_plan: str = ""
    model_config: ModelConfig = field(default_factory=ModelConfig)
    policy_config: PolicyConfig = field(default_factory=PolicyConfig)
    vllm_config: VllmConfig = field(default_factory=VllmConfig)
    env_config: EnvConfig = field(default_factory=EnvConfig)
    openai_config: OpenAIConfig = field(default_factory=OpenAIConfig)
    env: Any = MISSING

    def __post_init__(self) -> None:
        p: list[str] = []
        _check(
            p,
            bool(self.rank_weights) and all(w >= 0 for w in self.rank_weights) and sum(self.rank_weights) > 0,
            f"rank_weights must be non-negative with a positive sum (got {list(self.rank_weights)})",
        )
        _raise(p)


def register_configs() -> None:
    """Register the schema nodes in Hydra's ConfigStore (call once, from entry points)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="rollout_schema", node=RolloutConfig)


def validate(cfg: DictConfig) -> RolloutConfig:
    """Check the composed config; return it as typed objects or raise one ConfigError with every problem."""
    problems: list[str] = []
    for key in ("data_path", "log_path"):
        if OmegaConf.is_missing(cfg, key) or not cfg[key]:
            problems.append(f"{key} is required (got nothing); pass {key}=/path/to/dir")
    if OmegaConf.is_missing(cfg, "env") or not isinstance(cfg.env, DictConfig):
        problems.append(
            "env must name an environment (got nothing); pass env=reasoning_gym or another file of configs/env/"
        )
    elif "_target_" not in cfg.env or not cfg.env._target_:
        problems.append(
            "env._target_ must name the environment's class (got nothing); pass env._target_=my_envs.guess."
            "GuessNumberEnv (with env=custom: your own class, docs/environments.md) or env=reasoning_gym"
        )
    sections: dict[str, Any] = {}
    for key, schema in (
        ("model_config", ModelConfig),
        ("policy_config", PolicyConfig),
        ("vllm_config", VllmConfig),
        ("env_config", EnvConfig),
        ("openai_config", OpenAIConfig),
    ):
        merged = OmegaConf.merge(OmegaConf.structured(schema), cfg[key])
        problems += _schema.problems(merged, key)
        try:
            sections[key] = OmegaConf.to_object(merged)
        except ConfigError as exc:
            problems.extend(exc.problems)
    problems += _schema.problems(OmegaConf.merge(OmegaConf.structured(RolloutConfig), cfg), deep=False)
    if problems:
        raise ConfigError(problems)
    top = {k: cfg[k] for k in ("split", "iteration", "rank", "resume", "seed", "policy_version")}
    top["takeover_plan"] = str(cfg.get("takeover_plan") or "")
    try:
        run = RolloutConfig(
            data_path=str(cfg.data_path),
            log_path=str(cfg.log_path),
            rank_weights=[float(w) for w in cfg.rank_weights],
            env=cfg.env,
            **top,
            **sections,
        )
    except ConfigError as exc:
        raise ConfigError(problems + exc.problems) from None
    _check(
        problems,
        run.rank < len(run.rank_weights),
        f"rank must be < len(rank_weights) = {len(run.rank_weights)} (got {run.rank}); "
        "pass one weight per rank, e.g. rank_weights=[1,1]",
    )
    _check(
        problems,
        not run.takeover_plan or len(run.rank_weights) > 1,
        f"takeover_plan needs several ranks (got {run.takeover_plan!r} with rank_weights={list(run.rank_weights)}); "
        "only a survivor of a multi-node rollout takes over a dead rank's episodes: leave it empty",
    )
    if run.env_config.limits_scope == "cluster":
        for name in ("server_size", "max_vllm_sessions"):
            problem = cluster_limit_problem(name, getattr(run.env_config, name), run.rank_weights)
            _check(problems, not problem, problem)
    if run.vllm_config.max_model_len:
        problem = prompt_room_problem(run.policy_config.max_new_tokens, run.vllm_config.max_model_len)
        _check(problems, not problem, problem)
    size_key = f"{run.split}_tasks"
    _check(
        problems,
        bool(getattr(run.env_config, size_key)),
        f"env_config.{size_key} must name a task file for split={run.split} (got '')",
    )
    if run.split == "train" and run.env_config.train_tasks_sampler == "ratio":
        _check(
            problems,
            bool(run.env_config.difficulty_ratio),
            "env_config.difficulty_ratio must define buckets for train_tasks_sampler=ratio (got {}); "
            "e.g. '+env_config.difficulty_ratio={easy:{low:1,high:3,weight:2}}' (with the +: the dict is empty)",
        )
    _raise(problems)
    return run
