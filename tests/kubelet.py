"""The kubelet's ``$(VAR)`` expansion of a container's command and args, as the pod's process gets them.

Ported from Kubernetes' third_party/forked/golang/expansion/expand.go (v1.36.3): ``$$`` becomes
``$``, ``$(NAME)`` becomes the value of the container's variable NAME when it has one (and stays as
it is when not), and any other ``$`` stays. No shell is involved: this is the one rewrite a
container's argv goes through between the pod spec and ``execve``.
"""

from __future__ import annotations

from collections.abc import Mapping


def expand(text: str, env: Mapping[str, str]) -> str:
    out: list[str] = []
    cursor = 0
    while cursor < len(text):
        if text[cursor] != "$" or cursor + 1 == len(text):
            out.append(text[cursor])
            cursor += 1
            continue
        after = text[cursor + 1]
        if after == "$":
            out.append("$")
            cursor += 2
        elif after == "(" and (closer := text.find(")", cursor + 2)) != -1:
            name = text[cursor + 2 : closer]
            out.append(env.get(name, f"$({name})"))
            cursor = closer + 1
        else:  # an unclosed "$(" or a "$" that opens nothing: kept, with the character after it
            out.append("$" + after)
            cursor += 2
    return "".join(out)


def container_argv(container: dict[str, object], env: Mapping[str, str]) -> list[str]:
    """The argv the container's process starts with: command then args, each element expanded."""
    command = container.get("command") or []
    args = container.get("args") or []
    assert isinstance(command, list)
    assert isinstance(args, list)
    return [expand(str(part), env) for part in [*command, *args]]
