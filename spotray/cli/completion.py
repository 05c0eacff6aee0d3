"""``spotray completion bash|zsh``: a shell completion script, written from the argument parser itself.

Commands, each command's flags and the choices of flags that have them come from the parser, so the
script never lags behind a new flag. Where a command takes a run's name, the script asks kubectl for
the TrainingRuns of the namespace given with ``-n`` (kubectl's own kube config and context: nothing
of spotray's runs at completion time); elsewhere it completes file names.

    source <(spotray completion bash)                # this shell
    spotray completion bash > ~/.local/share/bash-completion/completions/spotray
    source <(spotray completion zsh)                 # zsh, through bashcompinit
"""

from __future__ import annotations

import argparse
import shlex

SHELLS = ("bash", "zsh")
# Commands whose RUN is a TrainingRun's (or sweep's) name in the cluster.
RUN_NAME_COMMANDS = ("status", "watch", "logs", "delete", "suspend", "resume", "checkpoints", "pull", "plot")

_BASH = """# spotray completion for bash (spotray completion bash); written from spotray's own argument parser.
_spotray_runs() {{
  local namespace="" i
  for ((i = 1; i < COMP_CWORD; i++)); do
    case "${{COMP_WORDS[i]}}" in -n | --namespace) namespace="${{COMP_WORDS[i + 1]}}" ;; esac
  done
  kubectl get trainingruns ${{namespace:+-n "$namespace"}} -o 'jsonpath={{.items[*].metadata.name}}' 2>/dev/null
}}

_spotray() {{
  local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD - 1]}}" command="${{COMP_WORDS[1]}}"
  if [[ $COMP_CWORD -eq 1 ]]; then
    mapfile -t COMPREPLY < <(compgen -W "{commands} --help --version" -- "$cur")
    return
  fi
  local flags=""
  case "$command" in
{flag_cases}
  esac
  case "$prev" in
{choice_cases}
  esac
  if [[ "$cur" == -* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$flags" -- "$cur")
  elif [[ " {run_commands} " == *" $command "* && ! -e "$cur" && "$cur" != */* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$(_spotray_runs)" -- "$cur")
  else
    mapfile -t COMPREPLY < <(compgen -f -- "$cur")
  fi
}}
complete -o default -F _spotray spotray
"""


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def bash_script(parser: argparse.ArgumentParser) -> str:
    commands = _subcommands(parser)
    flag_cases, choice_cases = [], {}
    for name, sub in commands.items():
        flags = [option for action in sub._actions for option in action.option_strings]
        flag_cases.append(f"    {name}) flags={shlex.quote(' '.join(flags))} ;;")
        for action in sub._actions:
            if action.choices and action.option_strings:
                choice_cases[" | ".join(action.option_strings)] = " ".join(map(str, action.choices))
    choices = [
        f'    {options}) mapfile -t COMPREPLY < <(compgen -W "{words}" -- "$cur"); return ;;'
        for options, words in choice_cases.items()
    ]
    return _BASH.format(
        commands=" ".join(commands),
        flag_cases="\n".join(flag_cases),
        choice_cases="\n".join(choices),
        run_commands=" ".join(RUN_NAME_COMMANDS),
    )


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    if shell == "zsh":
        return "autoload -U +X bashcompinit && bashcompinit\n" + bash_script(parser)
    return bash_script(parser)
