"""Tools and rewards that misbehave, imported by the worker processes of the agent tests."""

import os
import time


def hang(arguments: dict) -> str:
    time.sleep(3600)
    return "never"


def crash(arguments: dict) -> str:
    os._exit(3)


def huge(arguments: dict) -> str:
    return "x" * (10 << 20)


def hog(arguments: dict) -> str:
    block = bytearray(2 << 30)  # past the worker's address-space limit
    return str(len(block))


def shout(arguments: dict) -> str:
    print("noise on stdout must not corrupt the reply")
    return str(arguments.get("expression", "")).upper()


def hanging_reward(completion: str, answer: str) -> float:
    time.sleep(3600)
    return 1.0


def exact_reward(completion: str, answer: str) -> float:
    return 1.0 if completion.strip() == answer else 0.0


def spew(arguments: dict) -> str:
    chunk = "spew " * 200_000 + "\n"  # 1 MB a line, to stdout and to stderr
    for _ in range(int(arguments.get("expression", "8"))):
        print(chunk, end="")
        print(chunk, end="", file=__import__("sys").stderr)
    return "done"
