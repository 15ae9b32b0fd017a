"""The workflow around training: prepare data (``jaxhc data prepare``: `jaxhc.data.prepare`).

The command-line parsing of these commands is `jaxhc.workflow.commands`.
"""

__all__: list[str] = []
