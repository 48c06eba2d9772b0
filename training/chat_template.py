"""Find the LLaMA-Factory template that renders the model's own chat template token for token.

    choice = choose_template(model_dir, Wanted(template="auto", default_system="auto"), Encoding("sft", True))
    choice.template, choice.default_system    # "qwen3", ""  (the recipe's `template` and `default_system`)
    choice.matches                            # every template that renders the probes the same: ["qwen3"]

vLLM renders each prompt with the model's chat template (its tokenizer's `chat_template`, with
`model_config.chat_template_kwargs`); LLaMA-Factory renders the training rows with one of its own
templates. The update trains what the policy sampled only when the two agree, so before anything starts
the model's template renders probe conversations — one without a system message, one with a system
message and three turns, and (for a model whose template knows `</think>`) replies that reason first —
and every LLaMA-Factory template encodes the same rows the way the update's stage encodes them
(`SupervisedDatasetProcessor` for sft, so `mask_history` counts; `encode_oneturn` for kto/dpo). A
template matches when each prompt's ids equal the model's and each reply's ids are the reply's ids
followed only by the end of turn (training.alignment.compare). `default_system: auto` is the system prompt
the model's template inserts when a conversation has none ("" when it inserts none).

Bad input (ConfigError, exit 2): a model without a usable tokenizer (none loads, or it encodes text to
nothing) or without a chat template; a named template that does not match (the message names those that
do); no LLaMA-Factory template matching. Runs in the train environment.
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from rollout_engine.errors import ConfigError
from rollout_engine.vision import vision_family
from training.alignment import compare, split_labels

log = logging.getLogger(__name__)
#: placeholders that show where a system prompt and a user message land in a rendered template
SYS_MARK, USER_MARK = "Xsysmark", "Xusermark"


@dataclass(frozen=True)
class Wanted:
    """What the configuration says: a template name or auto, a system prompt, auto or None (the template's)."""

    template: str = "auto"
    default_system: str | None = "auto"
    #: model_config.chat_template_kwargs as sorted JSON (hashable)
    kwargs_json: str = "{}"
    #: the templates that would match with default_system auto (set while choosing, for the messages)
    with_auto_system: tuple[str, ...] = ()

    @property
    def kwargs(self) -> dict[str, Any]:
        return json.loads(self.kwargs_json)


@dataclass(frozen=True)
class Encoding:
    """How the update encodes rows: its stage and whether only the last turn is trained."""

    stage: str = "sft"
    mask_history: bool = True


@dataclass
class Choice:
    template: str
    #: the recipe's default_system (None: the template's own)
    default_system: str | None
    matches: list[str] = field(default_factory=list)
    #: the model's chat template knows <think>...</think>
    reasoning: bool = False

    def describe(self) -> str:
        system = "none" if self.default_system == "" else repr(self.default_system)
        others = [m for m in self.matches if m != self.template]
        also = f"; also matching: {', '.join(others)}" if others else ""
        return f"{self.template} (default_system {system}){also}"


@dataclass(frozen=True)
class Probe:
    """One conversation ending on a user turn, and the reply the model gives."""

    messages: tuple[tuple[str, str], ...]
    reply: str


def probes(reasoning: bool, thinking: bool) -> list[Probe]:
    """The probe conversations; a reasoning model's replies think first (when thinking is on)."""

    def said(reasoning_text: str, answer: str) -> str:
        return f"<think>\n{reasoning_text}\n</think>\n\n{answer}" if reasoning and thinking else answer

    turns = (
        ("system", "You are a careful agent. Reply with one action."),
        ("user", "Task: open the red door.\nYou see a red door and a key."),
        ("assistant", said("The door is locked, so I need the key.", "take key")),
        ("user", "You take the key."),
        ("assistant", said("Now the door.", "unlock red door with key")),
        ("user", "The door opens. What next?"),
    )
    return [
        Probe((("user", "What is 3 + 4? Answer with only the final number."),), said("3 plus 4 is 7.", "7")),
        Probe(turns, said("Open it and go through.", "open red door")),
    ]


def load_tokenizer(model: Path) -> Any:
    """The model's tokenizer as LLaMA-Factory loads it; ConfigError when none is usable."""
    return load_parts(model)[0]


def load_parts(model: Path) -> tuple[Any, Any]:
    """The model's tokenizer and processor (None for a text model) as LLaMA-Factory loads them; ConfigError when
    no tokenizer is usable. A vision-language template's plugin needs the processor even for rows without images."""
    from llamafactory.hparams import ModelArguments
    from llamafactory.model import load_tokenizer as lf_load

    try:
        parts = lf_load(ModelArguments(model_name_or_path=str(model), trust_remote_code=True))
        tokenizer, processor = parts["tokenizer"], parts.get("processor")
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ConfigError(
            f"model {model} has no tokenizer transformers can load ({type(exc).__name__}: {exc}); "
            "give model_config.model a Hugging Face folder with its tokenizer files (tokenizer.json or "
            "tokenizer.model, tokenizer_config.json)"
        ) from None
    if not tokenizer.encode("hello world", add_special_tokens=False):
        raise ConfigError(
            f"model {model} has no usable tokenizer: it encodes 'hello world' to no tokens (its tokenizer files "
            "are missing or empty); give model_config.model a folder with the model's tokenizer files"
        )
    if not isinstance(getattr(tokenizer, "chat_template", None), str):
        raise ConfigError(
            f"model {model} has no chat template (tokenizer_config.json's chat_template, chat_template.jinja); "
            "use the instruct or chat variant of the model, or add its chat template to the folder"
        )
    return tokenizer, processor


def render(tokenizer: Any, messages: list[dict[str, str]], kwargs: dict[str, Any], prompt: bool = True) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt, **kwargs)


def model_default_system(tokenizer: Any, kwargs: dict[str, Any]) -> str:
    """The system prompt the model's template inserts when a conversation has none ("" for none)."""
    with_system = render(
        tokenizer, [{"role": "system", "content": SYS_MARK}, {"role": "user", "content": USER_MARK}], kwargs
    )
    without = render(tokenizer, [{"role": "user", "content": USER_MARK}], kwargs)
    head, sep, tail = with_system.partition(SYS_MARK)
    if sep and without.startswith(head) and without.endswith(tail) and len(without) >= len(head) + len(tail):
        return without[len(head) : len(without) - len(tail)]
    return ""


def stop_token(tokenizer: Any, kwargs: dict[str, Any]) -> int | None:
    """The token that ends the model's turn: the first one its template writes after a reply."""
    text = render(
        tokenizer, [{"role": "user", "content": USER_MARK}, {"role": "assistant", "content": SYS_MARK}], kwargs, False
    )
    after = text.rpartition(SYS_MARK)[2]
    ids = tokenizer.encode(after, add_special_tokens=False) if after.strip() else []
    return ids[0] if ids else tokenizer.eos_token_id


def expected(tokenizer: Any, probe: Probe, kwargs: dict[str, Any], stop: int | None) -> tuple[list[int], list[int]]:
    """What vLLM would see and sample: the rendered prompt's ids, then the reply's ids and the stop token."""
    messages = [{"role": r, "content": c} for r, c in probe.messages]
    prompt = tokenizer.encode(render(tokenizer, messages, kwargs), add_special_tokens=False)
    reply = tokenizer.encode(probe.reply, add_special_tokens=False) + ([stop] if stop is not None else [])
    return prompt, reply


def encode(
    template: Any, tokenizer: Any, probe: Probe, encoding: Encoding, processor: Any = None
) -> tuple[list[int], list[int]]:
    """LLaMA-Factory's (prompt ids, trained reply ids) of the probe as a training row of `encoding.stage`."""
    system = probe.messages[0][1] if probe.messages[0][0] == "system" else None
    turns = [{"role": r, "content": c} for r, c in probe.messages if r != "system"]
    reply = {"role": "assistant", "content": probe.reply}
    if encoding.stage != "sft":
        return template.encode_oneturn(tokenizer, [*turns, reply], system, None)
    from llamafactory.data.processor import SupervisedDatasetProcessor
    from llamafactory.hparams import DataArguments

    data_args = DataArguments(cutoff_len=1 << 20, mask_history=encoding.mask_history)
    rows = SupervisedDatasetProcessor(template=template, tokenizer=tokenizer, processor=processor, data_args=data_args)
    input_ids, labels = rows._encode_data_example(turns, [reply], system, None, [], [], [])
    return split_labels(input_ids, labels)


def set_up(name: str, tokenizer: Any, default_system: str | None, kwargs: dict[str, Any], fix: bool) -> Any:
    """A private copy of LLaMA-Factory's template `name` set as get_template_and_fix_tokenizer sets it (which
    changes the registry's shared object); `fix` also fixes `tokenizer`'s special tokens (changes it)."""
    from llamafactory.data.template import ReasoningTemplate

    template = copy.deepcopy(registry()[name])
    if default_system is not None:
        template.default_system = default_system
    if isinstance(template, ReasoningTemplate):
        template.enable_thinking = kwargs.get("enable_thinking", True)
        template.preserve_thinking = False
    if fix:
        template.fix_special_tokens(tokenizer)
    return template


def matches(
    name: str,
    tokenizer: Any,
    wanted: list[tuple[list[int], list[int]]],
    probe_list: list[Probe],
    system: str | None,
    kwargs: dict[str, Any],
    encoding: Encoding,
    fix: bool,
    processor: Any = None,
) -> bool:
    try:
        template = set_up(name, tokenizer, system, kwargs, fix)
        eot = template._convert_elements_to_ids(tokenizer, template.format_assistant.apply(content=""))
        for (prompt, reply), probe in zip(wanted, probe_list, strict=True):
            got_prompt, got_reply = encode(template, tokenizer, probe, encoding, processor)
            if compare(prompt, reply, got_prompt, got_reply, eot) is not None:
                return False
    except Exception:  # a template that cannot encode these rows with this tokenizer does not match
        return False
    return True


def rank(names: list[str], model: Path) -> list[str]:
    """The order to prefer among matching templates: the model's own type (config.json), then a variant of it
    (qwen3_vl_nothink for qwen3_vl), then a name the model's path spells (smollm2 in SmolLM2-135M-Instruct, the
    longest first), then one LLaMA-Factory leaves the saved tokenizer's chat template alone with (else vLLM would
    serve another template next), then the shorter name."""
    model_type, spelled = _model_type(model), str(model).lower().replace("_", "")

    def key(name: str) -> tuple[int, int, int, int, str]:
        own = 0 if name == model_type else 1 if model_type and name.startswith(f"{model_type}_") else 2
        own = 2 + int(name.replace("_", "") not in spelled) if own == 2 else own
        return (own, -len(name) if own == 2 else 0, int(bool(registry()[name].replace_jinja_template)), len(name), name)

    return sorted(names, key=key)


@cache
def registry() -> dict[str, Any]:
    """LLaMA-Factory's templates as this process first saw them: get_template_and_fix_tokenizer sets the
    default system prompt (and thinking) on the registry's shared objects, so in a process that trained or
    checked before (the warm trainer) the registry holds the last update's settings, not the templates'."""
    from llamafactory.data.template import TEMPLATES

    return copy.deepcopy(TEMPLATES)


@cache
def choose_template(model: Path, wanted: Wanted, encoding: Encoding) -> Choice:
    """The template (and default system prompt) the update renders rows with; ConfigError when none fits."""
    templates = registry()
    tokenizer, processor = load_parts(model)
    kwargs = wanted.kwargs
    reasoning = "</think>" in tokenizer.chat_template
    probe_list = probes(reasoning, kwargs.get("enable_thinking", True) is not False)
    stop = stop_token(tokenizer, kwargs)
    want = [expected(tokenizer, p, kwargs, stop) for p in probe_list]
    system = model_default_system(tokenizer, kwargs) if wanted.default_system == "auto" else wanted.default_system
    user_turn = render(tokenizer, [{"role": "user", "content": USER_MARK}], kwargs)

    def plausible(name: str) -> bool:  # a cheap text test before the token-level one
        slots = templates[name].format_user.apply(content=USER_MARK)
        text = "".join(s for s in slots if isinstance(s, str))
        return USER_MARK in text and text.partition(USER_MARK)[0].strip() in user_turn

    # a vision-language model's rows carry images: only templates whose multimodal plugin is its family's expand them
    family = vision_family(_config(model))
    names = [n for n in templates if plausible(n) and (family is None or _plugin(n) == family.plugin)]
    found = rank(
        [n for n in names if matches(n, tokenizer, want, probe_list, system, kwargs, encoding, False, processor)], model
    )
    if not found and wanted.default_system != "auto":  # what the model's own system prompt would let match
        own = model_default_system(tokenizer, kwargs)
        hint = [n for n in names if matches(n, tokenizer, want, probe_list, own, kwargs, encoding, False, processor)]
        wanted = replace(wanted, with_auto_system=tuple(rank(hint, model)))
    if wanted.template != "auto":
        _check_named(wanted, found, model, reasoning)
        found = [wanted.template, *[n for n in found if n != wanted.template]]
    # LLaMA-Factory fixes the tokenizer's special tokens for the template it trains with: confirm on a copy
    confirmed = next(
        (
            n
            for n in found
            if matches(n, copy.deepcopy(tokenizer), want, probe_list, system, kwargs, encoding, True, processor)
        ),
        None,
    )
    if wanted.template != "auto" and confirmed != wanted.template:
        found = [n for n in found if n != wanted.template]
        _check_named(wanted, found, model, reasoning)
    if confirmed is None:
        raise ConfigError(
            f"no LLaMA-Factory template renders {model}'s chat template token for token ({_settings_hint(wanted)}): "
            + _no_match_hint(wanted, reasoning)
        )
    choice = Choice(confirmed, system, [confirmed, *[n for n in found if n != confirmed]], reasoning)
    log.info("chat template of %s: %s", model, choice.describe())
    return choice


def _check_named(wanted: Wanted, found: list[str], model: Path, reasoning: bool) -> None:
    """A template the user named must be one of those that match; ConfigError naming them otherwise."""
    if wanted.template not in registry():
        raise ConfigError(
            f"model_config.template={wanted.template!r} is not a LLaMA-Factory template; "
            + (f"the templates that render {model}'s chat template: {', '.join(found)}; " if found else "")
            + "set model_config.template=auto to find it from the model"
        )
    if wanted.template not in found:
        raise ConfigError(
            f"model_config.template={wanted.template!r} does not render {model}'s chat template token for token "
            f"({_settings_hint(wanted)}); "
            + (
                f"these do: {', '.join(found)} (set model_config.template={found[0]}, or auto)"
                if found
                else "no LLaMA-Factory template does: " + _no_match_hint(wanted, reasoning)
            )
        )


def _settings_hint(wanted: Wanted) -> str:
    kwargs = f", model_config.chat_template_kwargs={wanted.kwargs}" if wanted.kwargs else ""
    return f"model_config.default_system={wanted.default_system!r}{kwargs}"


def _no_match_hint(wanted: Wanted, reasoning: bool) -> str:
    hints = []
    if wanted.with_auto_system:
        shown = ", ".join(wanted.with_auto_system)
        hints.append(f"model_config.default_system=auto (the model's own system prompt: then {shown} match)")
    elif wanted.default_system != "auto":
        hints.append("model_config.default_system=auto")
    extra = sorted(set(wanted.kwargs) - {"enable_thinking"})
    if extra:
        hints.append(f"LLaMA-Factory renders only enable_thinking of model_config.chat_template_kwargs (drop {extra})")
    if reasoning:
        hints.append("algorithm.mask_history=true (LLaMA-Factory drops earlier turns' reasoning only then)")
    tried = "; try " + ", ".join(hints) if hints else ""
    return f"the update cannot train what this model samples{tried}; docs/models.md says what a model needs"


def _config(model: Path) -> dict[str, Any]:
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _model_type(model: Path) -> str:
    return str(_config(model).get("model_type", ""))


def _plugin(name: str) -> str:
    """The class name of LLaMA-Factory template `name`'s multimodal plugin (BasePlugin: none)."""
    return type(registry()[name].mm_plugin).__name__
