"""The workflow around training: prepare data, generate text, evaluate, export to transformers.

`jaxhc.data.prepare.prepare` (``jaxhc data prepare``), `generate_text` (``jaxhc generate``),
`evaluate` (``jaxhc eval``) and `export` (``jaxhc export``); `Run` reads a run directory back.
The command-line parsing of these commands is `jaxhc.workflow.commands`.
"""

from jaxhc.workflow.evaluate import evaluate as evaluate
from jaxhc.workflow.export import export as export
from jaxhc.workflow.generate import generate_text as generate_text
from jaxhc.workflow.run import Run as Run

__all__ = ["Run", "evaluate", "export", "generate_text"]
