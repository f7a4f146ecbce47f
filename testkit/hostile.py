"""Hostile inputs shared by unit and end-to-end tests."""

from __future__ import annotations


def alias_bomb(levels: int = 7) -> str:
    lines = ['  a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"  a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]")
    return "extra:\n" + "\n".join(lines) + "\n"
