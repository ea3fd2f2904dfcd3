"""What job scripts import: the CLI and the torch side (describe a module, apply a plan, export to TorchRec).

Wire models only (``solver.spec``); torch is imported by the torch-side modules, never by the CLI.
"""
