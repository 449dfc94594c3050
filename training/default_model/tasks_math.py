"""Arithmetic and counting conversations, answered after a short column-method thinking block.

Operand ranges: add and sub take a, b in [0, 99]; mul takes one operand in [0, 9] and the other
in [0, 99] (either order). Numbers are tokenised digit by digit, so the scratchpad works one
column at a time: ones first, then tens, then the answer.
"""

from __future__ import annotations

import random
from typing import Any

from training.default_model.pools import COUNT_WORDS
from training.default_model.split import arith_key, is_heldout

Conversation = dict[str, Any]
OPS = ("add", "sub", "mul")
ADD_MAX = 99
MUL_SMALL_MAX = 9

PHRASES = {
    "add": ["{a} + {b}", "{a}+{b}", "{a} plus {b}", "add {a} and {b}", "what is {a} + {b}?", "What is {a}+{b}?",
            "What's {a} plus {b}?", "Compute {a} + {b}.", "sum of {a} and {b}", "{a} + {b} = ?",
            "How much is {a} plus {b}?", "Please add {a} and {b}.", "what's the sum of {a} and {b}?"],
    "sub": ["{a} - {b}", "{a}-{b}", "{a} minus {b}", "subtract {b} from {a}", "what is {a} - {b}?",
            "What's {a} minus {b}?", "take {b} away from {a}", "{a} - {b} = ?", "Compute {a} - {b}.",
            "How much is {a} minus {b}?", "What is {a}-{b}?", "difference of {a} and {b}"],
    "mul": ["{a} * {b}", "{a}*{b}", "{a} x {b}", "{a} times {b}", "multiply {a} by {b}", "multiply {a} and {b}",
            "what is {a} * {b}?", "What's {a} times {b}?", "product of {a} and {b}", "{a} * {b} = ?",
            "Compute {a} × {b}.", "What is {a}×{b}?", "How much is {a} times {b}?"],
}
SYMBOL = {"add": "+", "sub": "-", "mul": "*"}


def result(op: str, a: int, b: int) -> int:
    return a + b if op == "add" else a - b if op == "sub" else a * b


def _join(hi: int, lo_digit: int) -> str:
    """Answer from the tens line's value and the ones digit, without a leading zero."""
    return f"{hi}{lo_digit}" if hi else str(lo_digit)


def _add_lines(a: int, b: int) -> list[str]:
    s = a % 10 + b % 10
    tens = a // 10 + b // 10 + s // 10
    return [f"{a % 10} + {b % 10} = {s}, write {s % 10} carry {s // 10}",
            f"{a // 10} + {b // 10} + {s // 10} = {tens}", f"Answer: {_join(tens, s % 10)}"]


def _sub_lines(a: int, b: int) -> list[str]:
    if a < b:  # negative result: compute b - a and negate
        inner = _sub_lines(b, a)
        return [f"{a} is less than {b}, so compute {b} - {a}"] + inner[:-1] + ["Answer: -" + inner[-1][8:]]
    borrow = 1 if a % 10 < b % 10 else 0
    top = a % 10 + 10 * borrow
    tens = a // 10 - b // 10 - borrow
    return [f"{top} - {b % 10} = {top - b % 10}, borrow {borrow}",
            f"{a // 10} - {b // 10} - {borrow} = {tens}", f"Answer: {_join(tens, top - b % 10)}"]


def _mul_lines(a: int, b: int) -> list[str]:
    m, n = (a, b) if a <= MUL_SMALL_MAX and (b > MUL_SMALL_MAX or a <= b) else (b, a)  # m single digit
    p = (n % 10) * m
    tens = (n // 10) * m + p // 10
    return [f"{n % 10} * {m} = {p}, write {p % 10} carry {p // 10}",
            f"{n // 10} * {m} + {p // 10} = {tens}", f"Answer: {_join(tens, p % 10)}"]


def scratchpad(op: str, a: int, b: int) -> str:
    lines = {"add": _add_lines, "sub": _sub_lines, "mul": _mul_lines}[op](a, b)
    return "\n".join([f"{a} {SYMBOL[op]} {b}"] + lines)


def sample_operands(rng: random.Random, op: str) -> tuple[int, int]:
    if op != "mul":
        return rng.randint(0, ADD_MAX), rng.randint(0, ADD_MAX)
    small, big = rng.randint(0, MUL_SMALL_MAX), rng.randint(0, ADD_MAX)
    return (small, big) if rng.random() < 0.5 else (big, small)


def draw_pair(rng: random.Random, op: str, heldout: bool) -> tuple[int, int]:
    """Operands whose canonical pair lies on the requested side of the split."""
    while True:
        a, b = sample_operands(rng, op)
        if is_heldout("arith", arith_key(op, a, b)) == heldout:
            return a, b


def question(rng: random.Random, op: str, a: int, b: int) -> str:
    text = rng.choice(PHRASES[op]).format(a=a, b=b)
    return text[0].upper() + text[1:] if rng.random() < 0.5 else text


def final_answer(rng: random.Random, op: str, a: int, b: int) -> str:
    r = result(op, a, b)
    return rng.choice([f"{a} {SYMBOL[op]} {b} = {r}.", f"The answer is {r}.", f"{r}"])


def arithmetic_conversation(rng: random.Random, heldout: bool = False, think: bool = True) -> Conversation:
    op = rng.choice(OPS)
    a, b = draw_pair(rng, op, heldout)
    msg: dict[str, Any] = {"role": "assistant", "content": final_answer(rng, op, a, b)}
    msg["reasoning_content"] = scratchpad(op, a, b) if think else ""
    return {"messages": [{"role": "user", "content": question(rng, op, a, b)}, msg],
            "enable_thinking": think, "meta": {"task": "arith", "op": op, "a": a, "b": b,
                                               "answer": result(op, a, b)}}


COUNT_PHRASES = ["How many items are in this list: {items}?", "Count the items: {items}",
                 "How many words are here: {items}?", "count these: {items}",
                 "How many things did I list? {items}", "Please count: {items}."]


def counting_conversation(rng: random.Random, think: bool = True) -> Conversation:
    n = rng.randint(1, 10)
    words = [rng.choice(COUNT_WORDS) for _ in range(n)]
    sep = rng.choice([", ", " ", ", "])
    items = sep.join(words)
    pad = "\n".join(f"{i + 1} {w}" for i, w in enumerate(words)) + f"\nAnswer: {n}"
    noun = "item" if n == 1 else "items"
    reply = rng.choice([f"There {'is' if n == 1 else 'are'} {n} {noun}.", f"{n}"])
    return {"messages": [{"role": "user", "content": rng.choice(COUNT_PHRASES).format(items=items)},
                         {"role": "assistant", "content": reply, "reasoning_content": pad if think else ""}],
            "enable_thinking": think, "meta": {"task": "count", "answer": n}}
