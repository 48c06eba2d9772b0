"""Which token mismatches are a template problem (fail) and which are the sampler's token split (drop)."""

from __future__ import annotations

from training.alignment import compare
from training.fidelity import _same_text

# A byte-level vocabulary in miniature: ids decode to pieces, byte tokens of a split character to U+FFFD.
PIECES = {1: "<s>", 2: "<|im_end|>", 3: "\n", 10: "The answer", 11: " is", 12: " 0", 13: " gr", 14: "ad", 15: " grad"}
PIECES |= {20: "\ufffd", 21: "\ufffd"}  # the first two bytes of a three-byte character


SPECIAL = {1, 2}


class Decoder:
    def decode(self, ids: list[int]) -> str:
        return "".join(PIECES[i] for i in ids)

    def decode_text(self, ids: list[int]) -> str:
        return "".join(PIECES[i] for i in ids if i not in SPECIAL)


EOT = [2, 3]
PROMPT = [1, 10]


def test_a_reply_cut_inside_a_multibyte_character_is_a_token_split_not_a_template_error() -> None:
    sampled = [11, 12, 20, 21]  # max_new_tokens reached after two bytes of a character
    trained = [11, 12, *EOT]  # the stored text has no partial character
    assert compare(PROMPT, sampled, PROMPT, trained, EOT) == 4
    assert _same_text(PROMPT, sampled, PROMPT, trained, EOT, Decoder())


def test_a_non_canonical_split_is_the_same_text() -> None:
    assert _same_text(PROMPT, [13, 14], PROMPT, [15, *EOT], EOT, Decoder())


def test_special_tokens_sampled_inside_a_reply_are_not_in_its_text() -> None:
    sampled = [11, 12, 1, 2]  # the policy emitted <s> before its end of turn; the server's text skips it
    trained = [11, 12, *EOT]
    assert compare(PROMPT, sampled, PROMPT, trained, EOT) == 4
    assert _same_text(PROMPT, sampled, PROMPT, trained, EOT, Decoder())


def test_a_different_prompt_or_reply_text_is_a_real_mismatch() -> None:
    assert not _same_text(PROMPT, [11, 12], [1, 11], [11, 12, *EOT], EOT, Decoder())  # template renders the prompt
    assert not _same_text(PROMPT, [11, 12, 20], PROMPT, [11, *EOT], EOT, Decoder())  # text lost beyond the bytes
