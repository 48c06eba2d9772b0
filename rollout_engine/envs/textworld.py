"""TextWorld: multi-turn text games generated offline from seeds.

A task names its game by generation settings (docs/environments.md):
`metadata.game = {"seed": 17, "nb_rooms": 3, "nb_objects": 5, "quest_length": 3}`.
The game is generated in-process (textworld `make_game` + `compile_game`, about
1.5 s) the first time it is needed and cached under `games_dir/<key>/`, a
directory created atomically (built beside it, then renamed), so ranks and runs
that share the directory generate each game once.

Each turn the model's reply is parsed into one command (`actions.parse_command`);
the game's feedback, with the ASCII banner and the `>` prompt stripped, is the
next observation. The turn reward is the score delta (the gym score is
cumulative); the episode reward is score / max_score and success is `won`.
`build_tasks` writes a deterministic task list for tests and experiments;
`expert` replays the game's walkthrough (demonstrations).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollout_engine.context import RunContext
from rollout_engine.envs.actions import parse_command
from rollout_engine.envs.base import Env, EpisodeState, Expert, Score, StepResult
from rollout_engine.envs.experts import ScriptedReplies
from rollout_engine.errors import ConfigError, EnvError
from rollout_engine.types import Message, Task

log = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are playing a text adventure game. Read the game text and reply with exactly one game command "
    "on a single line, such as: go east, take key, open chest, put apple on table. No explanation."
)
#: the expert's name on demonstrations (policy_model "expert:textworld-walkthrough")
WALKTHROUGH = "textworld-walkthrough"
INVALID_FEEDBACK = "That was not a game command. Reply with one command on a single line, for example: look"
#: the interpreter's own commands, not the game's: frotz answers `save` by writing game.qzl in the process's
#: folder and `restore` by reading it (one episode could load another's state), `script`/`recording` write a
#: file, `replay` reads one, and restart/quit end the session the episode is
META_COMMANDS = frozenset(
    {"save", "restore", "restart", "quit", "q", "script", "transcript", "unscript", "noscript", "recording", "replay"}
)
META_FEEDBACK = (
    "That is the interpreter's command, not the game's. Reply with one game command on a single line, for example: look"
)
_ALNUM = re.compile(r"[A-Za-z0-9]")
_BLANKS = re.compile(r"\n{3,}")


@dataclass(frozen=True)
class GameSpec:
    """The generation settings that name one game; equal specs give the same game."""

    seed: int
    nb_rooms: int = 3
    nb_objects: int = 5
    quest_length: int = 3

    @property
    def key(self) -> str:
        return f"r{self.nb_rooms}-o{self.nb_objects}-q{self.quest_length}-s{self.seed}"

    @classmethod
    def from_task(cls, task: Task) -> GameSpec:
        game = task.metadata.get("game")
        if not isinstance(game, dict) or "seed" not in game:
            raise EnvError(f"textworld task {task.task_id!r} needs metadata.game with a seed (got {game!r})")
        try:
            return cls(**{k: int(v) for k, v in game.items()})
        except (TypeError, ValueError) as exc:
            raise EnvError(f"textworld task {task.task_id!r}: bad metadata.game {game!r}: {exc}") from exc


@dataclass
class TextWorldState(EpisodeState):
    """Episode state: the open game and what the last step left."""

    game: Any = None
    intro: str = ""
    score: int = 0
    max_score: int = 1
    won: bool = False
    lost: bool = False
    facts: frozenset[str] = field(default_factory=frozenset)
    admissible: list[str] = field(default_factory=list)


def clean_feedback(text: str) -> str:
    """Game text without the ASCII banner, the trailing `>` prompt and runs of blank lines."""
    lines = text.replace("\r", "").split("\n")
    while lines and not _ALNUM.search(lines[0]):
        lines.pop(0)
    while lines and (not lines[-1].strip() or lines[-1].lstrip().startswith(">")):
        lines.pop()
    return _BLANKS.sub("\n\n", "\n".join(line.rstrip() for line in lines)).strip()


def build_tasks(
    count: int, seed: int, nb_rooms: int = 3, nb_objects: int = 5, quest_length: int = 3, prefix: str = "tw"
) -> list[dict[str, Any]]:
    """`count` task-file rows with distinct game seeds drawn deterministically from `seed`."""
    seeds = random.Random(seed).sample(range(1_000_000), count)
    rows = []
    for index, game_seed in enumerate(seeds):
        spec = GameSpec(game_seed, nb_rooms, nb_objects, quest_length)
        rows.append(
            {
                "task_id": f"{prefix}-{index:04d}",
                "task_name": f"Win the TextWorld game {spec.key}",
                "difficulty": quest_length,
                "env": "textworld",
                "family": f"textworld-q{quest_length}",
                "metadata": {"game": asdict(spec)},
            }
        )
    return rows


class TextWorldEnv(Env):
    """Text games through `textworld.gym`; one game process per episode."""

    name = "textworld"

    def __init__(
        self,
        context: RunContext,
        games_dir: str = "textworld/games",
        max_steps: int | None = None,
        stop_on_invalid: bool = False,
        show_admissible: bool = True,
        max_command_words: int = 12,
    ) -> None:
        problems = []
        if max_steps is not None and max_steps < 1:
            problems.append(f"env.max_steps must be >= 1 or null for the split's difficulty budget (got {max_steps})")
        if max_command_words < 1:
            problems.append(f"env.max_command_words must be >= 1 (got {max_command_words})")
        if problems:
            raise ConfigError(problems)
        self.context = context
        #: relative to the data path unless absolute
        self.games_dir = Path(context.data_path) / games_dir
        self.step_limit = max_steps
        self.stop_on_invalid = stop_on_invalid
        self.show_admissible = show_admissible
        self.max_command_words = max_command_words
        self._locks: dict[str, asyncio.Lock] = {}
        #: textworld keeps global state (knowledge base, grammar): every call to it runs on this one thread
        self._worker: ThreadPoolExecutor | None = None

    def check_task(self, task: Task) -> str | None:
        try:
            GameSpec.from_task(task)
        except EnvError as exc:
            return str(exc)
        return None

    async def setup_state(self, task: Task, slot: int) -> EpisodeState:
        spec = GameSpec.from_task(task)
        path = await self.ensure_game(spec)
        steps = self.step_limit or self.context.max_steps(task)
        state = TextWorldState(task=task, slot=slot, max_steps=steps)
        state.game, text, info = await self._call(_open_game, path, steps)
        state.intro = clean_feedback(text)
        _remember(state, info)
        return state

    def initial_messages(self, state: EpisodeState) -> list[Message]:
        assert isinstance(state, TextWorldState)
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self._observation(state, state.intro)},
        ]

    async def env_response(self, state: EpisodeState, reply: str) -> StepResult:
        assert isinstance(state, TextWorldState)
        command = parse_command(reply, self.max_command_words)
        if command is None:
            return StepResult(
                observation=INVALID_FEEDBACK, invalid_action=True, state_changed=False, action={"command": None}
            )
        if command.split()[0] in META_COMMANDS:
            return StepResult(
                observation=META_FEEDBACK, invalid_action=True, state_changed=False, action={"command": command}
            )
        admissible = command in {known.lower() for known in state.admissible}
        before_score, before_facts = state.score, state.facts
        text, _, done, info = await self._call(state.game.step, command)
        _remember(state, info)
        return StepResult(
            observation=self._observation(state, clean_feedback(text)),
            reward=float(state.score - before_score),
            done=bool(done or state.won or state.lost),
            action={"command": command, "admissible": admissible},
            state_changed=state.facts != before_facts,
        )

    async def score(self, state: EpisodeState) -> Score:
        assert isinstance(state, TextWorldState)
        info = {"score": state.score, "max_score": state.max_score, "won": state.won, "lost": state.lost}
        return Score(reward=state.score / max(state.max_score, 1), success=state.won, info=info)

    async def teardown_state(self, state: EpisodeState) -> None:
        if isinstance(state, TextWorldState) and state.game is not None:
            await self._call(state.game.close)
            state.game = None

    async def expert(self, task: Task) -> Expert | None:
        """The game's walkthrough (generated with the game, kept in its spec.json), replied one command a turn."""
        path = await self.ensure_game(GameSpec.from_task(task))
        walkthrough = json.loads((path.parent / "spec.json").read_text()).get("walkthrough") or []
        return ScriptedReplies([str(c) for c in walkthrough], name=WALKTHROUGH) if walkthrough else None

    async def close(self) -> None:
        if self._worker is not None:
            await asyncio.to_thread(self._worker.shutdown, wait=True, cancel_futures=True)
            self._worker = None

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="textworld")
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    async def ensure_game(self, spec: GameSpec) -> Path:
        """Path of the compiled game for `spec`, generating it once if it is not cached."""
        lock = self._locks.setdefault(spec.key, asyncio.Lock())
        async with lock:
            path = self.games_dir / spec.key / "game.z8"
            if not path.exists():
                await self._call(self._generate, spec)
            return path

    def _generate(self, spec: GameSpec) -> None:
        log.info("generating TextWorld game %s under %s", spec.key, self.games_dir)
        self.games_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{spec.key}.", dir=self.games_dir))
        try:
            _compile(spec, tmp)
            os.rename(tmp, self.games_dir / spec.key)
        except OSError:
            if not (self.games_dir / spec.key / "game.z8").exists():
                raise
            log.info("game %s was generated concurrently; using that copy", spec.key)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _observation(self, state: TextWorldState, text: str) -> str:
        if not self.show_admissible or not state.admissible:
            return text or "(no response)"
        return f"{text or '(no response)'}\n\nAvailable commands: {', '.join(state.admissible)}"


def _compile(spec: GameSpec, out: Path) -> None:
    # textworld is imported here: importing this module must stay cheap
    from textworld import GameOptions
    from textworld.generator import compile_game, make_game

    options = GameOptions()
    options.seeds = spec.seed
    options.nb_rooms, options.nb_objects, options.quest_length = spec.nb_rooms, spec.nb_objects, spec.quest_length
    options.path = str(out / "game.z8")
    options.force_recompile = True
    game = make_game(options)
    compile_game(game, options)
    about = {"spec": asdict(spec), "objective": game.objective, "walkthrough": list(game.walkthrough or [])}
    (out / "spec.json").write_text(json.dumps(about, indent=1) + "\n")
    for name in ("game.z8", "game.json", "spec.json"):
        with open(out / name, "rb") as handle:
            os.fsync(handle.fileno())


def _open_game(path: Path, max_steps: int) -> tuple[Any, str, dict[str, Any]]:
    import textworld
    import textworld.gym

    infos = textworld.EnvInfos(
        admissible_commands=True, won=True, lost=True, score=True, max_score=True, objective=True, facts=True
    )
    env_id = textworld.gym.register_game(str(path), infos, max_episode_steps=max_steps + 1)
    game = textworld.gym.make(env_id)
    text, info = game.reset()
    return game, text, info


def _remember(state: TextWorldState, info: dict[str, Any]) -> None:
    state.score = int(info.get("score") or 0)
    state.max_score = int(info.get("max_score") or 1)
    state.won, state.lost = bool(info.get("won")), bool(info.get("lost"))
    state.facts = frozenset(map(str, info.get("facts") or ()))
    state.admissible = list(info.get("admissible_commands") or [])
