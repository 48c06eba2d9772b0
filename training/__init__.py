"""The update phase: trajectories of recent iterations to the next policy.

`python -m training --config-name update log_path=L iteration=N` (in the train
environment) selects samples from the journals (`training.selection`), writes a
LLaMA-Factory dataset (`training.dataset`), checks token fidelity
(`training.fidelity`), writes the LLaMA-Factory YAML (`training.recipe`),
trains under torchrun (`training.launch`) and promotes the result as the next
policy version (`training.promotion`). docs/update.md describes it.

Importing this package does nothing.
"""
