"""Text helpers shared by the recipe's data preparation and reward."""

from __future__ import annotations

import re

_BOX_COMMAND = re.compile(r"\\(boxed|fbox)")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`, or `\\boxed 5`) in `text`, braces balanced."""
    for match in reversed(list(_BOX_COMMAND.finditer(text))):
        i = match.end()
        if i < len(text) and text[i].isalpha():  # \boxedfoo is another command
            continue
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            depth, j = 1, i + 1
            while j < len(text):
                char = text[j]
                if char == "\\":  # \{ and \} do not count
                    j += 2
                    continue
                if char == "{":
                    depth += 1
                elif char == "}":
                    depth -= 1
                    if depth == 0:
                        content = text[i + 1 : j].strip()
                        if content:
                            return content
                        break
                j += 1
        elif i > match.end() and match.group(1) == "boxed":  # "\boxed 5$"
            token = re.match(r"[^\s$]+", text[i:])
            if token:
                return token.group(0)
    return None
