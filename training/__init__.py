"""The update phase: trajectories of recent iterations to the next policy.

`python -m training --config-name update log_path=L iteration=N` (in the train
environment) selects samples from the journals (`training.selection`), writes a
LLaMA-Factory dataset (`training.dataset`), checks token fidelity
(`training.fidelity`), writes the LLaMA-Factory YAML (`training.recipe`),
trains under torchrun (`training.launch`) and promotes the result as the next
policy version (`training.promotion`). On one node run.sh runs these steps in
a trainer that stays up for the whole run (`training.warm`). docs/update.md describes it.

Importing this package does nothing.
"""
