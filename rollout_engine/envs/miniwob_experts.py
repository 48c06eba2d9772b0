"""Scripted solvers for simple MiniWoB++ pages, reading only what the model reads.

Each solver turns the task's utterance (the `Task:` line of the first user
message) into a plan of steps such as "type the password into the 2nd text
box" or "click the button named Submit". At step k the expert resolves step k
against the latest aria snapshot in the chat (the element's `[ref=...]`) and
replies in the action syntax `actions.parse_web_action` accepts:
`click(e4)` or `type(e5, "text")`. So a demonstration is solvable from the
prompt alone and its replies are valid actions.

    expert = miniwob_expert("enter-text")     # None for a page without a solver
    sorted(SOLVERS)                           # the pages with one

An utterance the solver does not recognise, or an element missing from the
snapshot, is an `EnvError`: that episode fails and is not kept.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from rollout_engine.envs.experts import expert_reply, steps_taken
from rollout_engine.errors import EnvError
from rollout_engine.types import Completion, Message

EXPERT_NAME = "miniwob-script"
_GOAL = re.compile(r"^Task: (?P<goal>.*?)\n\nPage:\n", re.DOTALL)
# `- button "Submit" [ref=e6]`, `- 'link "Tab #1" [ref=f2e6] [cursor=pointer]':`, `- textbox [ref=e5]: text`
_ELEMENT = re.compile(r"^\s*-\s*'?(?P<role>[a-z]+)(?:\s+\"(?P<name>(?:[^\"\\]|\\.)*)\")?(?P<attrs>(?:\s*\[[^\]]*\])*)")
_REF = re.compile(r"\[ref=(?P<ref>[^\]]+)\]")


@dataclass(frozen=True)
class Element:
    """One element of an aria snapshot that carries a ref."""

    role: str
    name: str | None
    ref: str


@dataclass(frozen=True)
class Step:
    """Click or type into the `index`-th element of `role` (named `name`, when given)."""

    verb: str
    role: str
    name: str | None = None
    index: int = 0
    text: str = ""

    def reply(self, elements: list[Element]) -> str:
        """The action text for this step on the page the snapshot shows."""
        found = [e for e in elements if e.role == self.role and (self.name is None or e.name == self.name)]
        if len(found) <= self.index:
            what = f'{self.role} "{self.name}"' if self.name is not None else f"{self.role} #{self.index + 1}"
            raise EnvError(f"expert {EXPERT_NAME}: no {what} in the snapshot")
        ref = found[self.index].ref
        if self.verb == "click":
            return f"click({ref})"
        if '"' not in self.text:
            return f'type({ref}, "{self.text}")'
        if "'" not in self.text:
            return f"type({ref}, '{self.text}')"
        raise EnvError(f"expert {EXPERT_NAME}: {self.text!r} holds both quote kinds; no action can type it")


def parse_snapshot(text: str) -> list[Element]:
    """Every element with a ref in an aria snapshot (`aria_snapshot(mode="ai")`), in page order."""
    elements = []
    for line in text.splitlines():
        match = _ELEMENT.match(line)
        ref = _REF.search(match.group("attrs")) if match else None
        if match and ref:
            name = match.group("name")
            name = None if name is None else name.replace('\\"', '"')
            elements.append(Element(match.group("role"), name, ref["ref"]))
    return elements


def click(role: str, name: str | None = None, index: int = 0) -> Step:
    return Step("click", role, name, index)


def type_into(index: int, text: str) -> Step:
    return Step("type", "textbox", index=index, text=text)


def _submit(name: str = "Submit") -> Step:
    return click("button", name)


def _checkboxes(names: str) -> list[Step]:
    chosen = [] if names == "nothing" else [n.strip() for n in names.split(",") if n.strip()]
    return [*(click("checkbox", n) for n in chosen), _submit()]


def _case(text: str, case: str) -> str:
    return text.upper() if case == "upper" else text.lower()


#: page -> (utterance pattern, plan from its groups)
SOLVERS: dict[str, tuple[re.Pattern[str], Callable[..., list[Step]]]] = {
    "click-test": (re.compile(r"Click the button\."), lambda: [click("button", "Click Me!")]),
    "click-test-2": (re.compile(r"Click button (\S+)\."), lambda name: [click("button", name)]),
    "click-button": (re.compile(r'Click on the "(.+)" button\.'), lambda name: [click("button", name)]),
    "click-button-sequence": (
        re.compile(r"Click button (\S+), then click button (\S+)\."),
        lambda a, b: [click("button", a), click("button", b)],
    ),
    "click-tab": (re.compile(r"Click on (Tab #\d+)\."), lambda tab: [click("link", tab)]),
    "click-link": (re.compile(r'Click on the link "(.+)"\.'), lambda name: [click("link", name)]),
    # jQuery UI names its close button "Close"; the page calls it "x"
    "click-dialog": (re.compile(r'Close the dialog box by clicking the "x"\.'), lambda: [click("button", "Close")]),
    "focus-text": (re.compile(r"Focus into the textbox\."), lambda: [click("textbox")]),
    "focus-text-2": (
        re.compile(r"Focus into the (\d+)(?:st|nd|rd|th) input textbox\."),
        lambda nth: [click("textbox", index=int(nth) - 1)],
    ),
    "enter-text": (
        re.compile(r'Enter "(.*)" into the text field and press Submit\.'),
        lambda text: [type_into(0, text), _submit()],
    ),
    "enter-text-2": (
        re.compile(r'Type "(.*)" in all (upper|lower) case letters in the text input and press Submit\.'),
        lambda text, case: [type_into(0, _case(text, case)), _submit()],
    ),
    "enter-password": (
        re.compile(r'Enter the password "(.*)" into both text fields and press submit\.'),
        lambda password: [type_into(0, password), type_into(1, password), _submit()],
    ),
    "login-user": (
        re.compile(r'Enter the username "(.*)" and the password "(.*)" into the text fields and press login\.'),
        lambda user, password: [type_into(0, user), type_into(1, password), _submit("Login")],
    ),
    "click-option": (re.compile(r"Select (.+) and click Submit\."), lambda name: [click("radio", name), _submit()]),
    "click-checkboxes": (re.compile(r"Select (.*) and click Submit\."), _checkboxes),
}


@dataclass
class MiniWobExpert:
    """Solves one MiniWoB++ page from the chat: the utterance gives the plan, the last snapshot the refs."""

    page: str
    name: str = EXPERT_NAME

    def plan(self, goal: str) -> list[Step]:
        pattern, planner = SOLVERS[self.page]
        match = pattern.fullmatch(goal.strip())
        if match is None:
            raise EnvError(f"expert {self.name}: {self.page} utterance {goal!r} does not match {pattern.pattern!r}")
        return planner(*match.groups())

    async def chat(self, messages: list[Message]) -> Completion:
        users = [str(m.get("content") or "") for m in messages if m.get("role") == "user"]
        found = _GOAL.match(users[0]) if users else None
        if found is None:
            raise EnvError(f"expert {self.name}: the first user message holds no 'Task: ...' line")
        plan, step = self.plan(found["goal"]), steps_taken(messages)
        if step >= len(plan):
            raise EnvError(f"expert {self.name}: the {len(plan)} steps of the plan did not end the {self.page} episode")
        return expert_reply(plan[step].reply(parse_snapshot(users[-1])))


def miniwob_expert(page: str) -> MiniWobExpert | None:
    """The scripted solver of `page`, or None when there is none."""
    return MiniWobExpert(page) if page in SOLVERS else None
