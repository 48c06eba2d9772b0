"""algorithm=grpo in LLaMA-Factory's own training loop: its SFT workflow with the policy-gradient loss.

    run(recipe_args, callbacks)   # every rank, from training.trainer_run (the warm trainer and the fresh path)

What LLaMA-Factory's `run_sft` does, with three changes: the dataset's rows (encoded by LLaMA-Factory's own
template and processor, as the token-fidelity check compared them with the sampled ids) get three columns
from `train.token_ids.jsonl` (the episode's `advantage`, how many of each trained turn's tokens the policy
produced — an episode row trains all its turns, training.episodes — and the behaviour policy's
`completion_logprobs` where the rollout recorded them); a collator wrapper (`PolicyGradientCollator`) takes
those columns out before LLaMA-Factory's collator pads the rest, masks the labels the policy did not produce
(each turn's end-of-turn tokens after the sampled ones), and aligns the behaviour log-probabilities with the
labels; and `PolicyGradientTrainer`, a CustomSeq2SeqTrainer,
overrides `compute_loss` with training.pg_loss. With `old_logprobs: trainer` its first `compute_loss` scores the
rows the update's steps will reach once more, without gradients, before any step (`recompute_old`), and the ratio is
formed against those scores, each token's term weighed by min(exp(trainer - vLLM), tis_cap). The HF Trainer's loop,
optimizer, scheduler, DeepSpeed, LoRA, saving and logging are LLaMA-Factory's and transformers' own.

The recipe's `baton_policy_gradient` (training.recipe.POLICY_GRADIENT) holds the loss settings; it is taken
out before LLaMA-Factory's parser reads the rest.
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.alignment import label_runs
from training.config import PolicyGradientConfig
from training.dataset import load_token_ids, sampled_turns
from training.pg_loss import IGNORE_INDEX, policy_gradient_loss, token_logprobs
from training.recipe import POLICY_GRADIENT

log = logging.getLogger(__name__)

#: the dataset columns added to LLaMA-Factory's encoded rows, taken out again by the collator wrapper
ADVANTAGE, POLICY_TOKENS, LOGPROBS, ROW = "pg_advantage", "pg_policy_tokens", "pg_logprobs", "pg_row"
#: the batch keys the collator wrapper adds, which compute_loss takes out before the model's forward
BATCH_KEYS = ("pg_advantages", "pg_behaviour", "pg_has_behaviour", "pg_rows")


@dataclass(frozen=True)
class Columns:
    """The per-row values of the policy-gradient loss, in dataset order."""

    advantages: list[float]
    #: per run of trained labels (one per trained assistant turn, in order), how many of its first labels the
    #: policy produced; [-1]: all labels of the row (a row without sampled ids)
    policy_tokens: list[list[int]]
    #: the behaviour log-probabilities of those tokens, the turns' one after the other ([] where the rollout
    #: recorded none)
    logprobs: list[list[float]]

    @property
    def without_logprobs(self) -> int:
        return sum(1 for lp in self.logprobs if not lp)


def build_columns(labels: list[list[int]], rows: list[dict[str, Any]], sidecar: Path) -> Columns:
    """The columns of the encoded dataset (`labels`, LLaMA-Factory's) from `rows` of `train.token_ids.jsonl`.

    The rows must be the dataset's, one for one, and each trained turn's labels (a run of trained labels) must
    begin with the ids the policy sampled for that turn (`completion_token_ids`; what follows them is the
    template's end of turn, not trained): an episode row (training.episodes) has one run per turn, a per-turn
    row its reply as the last run (earlier runs, trained under mask_history false, are not the policy's tokens
    of this row: masked). Otherwise the advantages and log-probabilities would land on other tokens, so
    ValueError naming the row."""
    if len(rows) != len(labels):
        raise ValueError(
            f"{sidecar} has {len(rows)} rows but LLaMA-Factory encoded {len(labels)} (it drops malformed rows); "
            "prepare the data again (phase=prepare)"
        )
    out = Columns([], [], [])
    for index, (row_labels, row) in enumerate(zip(labels, rows, strict=True)):
        where = f"{sidecar} row {index} ({row.get('source')})"
        if not isinstance(row.get("advantage"), int | float):
            raise ValueError(f"{where} has no advantage: prepare the data with algorithm=grpo")
        out.advantages.append(float(row["advantage"]))
        turns = sampled_turns(row)
        if any(turn.completion_token_ids is None for turn in turns):  # no token ids: the labels are all we know
            out.policy_tokens.append([-1])
            out.logprobs.append([])
            continue
        runs = label_runs(row_labels)
        untrained = len(runs) - 1 if len(turns) == 1 and len(runs) > 1 else 0  # a per-turn row's history replies
        if len(runs) - untrained != len(turns):
            raise ValueError(
                f"{where} holds {len(turns)} sampled replies but LLaMA-Factory trains {len(runs)} turns of it; "
                "prepare the data again (phase=prepare), or set data.episode_rows=per_turn"
            )
        counts, logprobs = [0] * untrained, []
        for (start, end), turn in zip(runs[untrained:], turns, strict=True):
            ids, recorded = turn.completion_token_ids or [], turn.completion_logprobs
            if row_labels[start:end][: len(ids)] != ids:
                raise ValueError(
                    f"{where}: LLaMA-Factory's trained tokens of {turn.source} are not its sampled "
                    "completion_token_ids; run the update with data.fidelity_samples=-1 (the token-fidelity check "
                    "names the difference and drops re-tokenized replies)"
                )
            if recorded is not None and len(recorded) != len(ids):
                raise ValueError(
                    f"{where} has {len(recorded)} completion_logprobs for {len(ids)} completion_token_ids of "
                    f"{turn.source}; they must pair one for one (the rollout's journal is damaged: roll it out again)"
                )
            counts.append(len(ids))
            logprobs.append([float(x) for x in recorded or []])
        out.policy_tokens.append(counts)
        # a row's ratio is formed against recorded values on every trained token, or on none (on-policy)
        complete = all(turn.completion_logprobs is not None for turn in turns)
        out.logprobs.append([x for turn in logprobs for x in turn] if complete else [])
    return out


def policy_positions(labels: list[int], counts: list[int]) -> list[int]:
    """The positions of the labels the policy produced: the first `counts[i]` labels of the i-th run of trained
    labels (`Columns.policy_tokens`; [-1]: every trained label)."""
    runs = label_runs(labels)
    if counts == [-1]:
        return [i for start, end in runs for i in range(start, end)]
    return [i for (start, _), count in zip(runs, counts, strict=False) for i in range(start, start + count)]


class PolicyGradientCollator:
    """LLaMA-Factory's collator with the policy-gradient columns carried beside it (module doc)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        extra = [{key: f[key] for key in (ADVANTAGE, POLICY_TOKENS, LOGPROBS, ROW)} for f in features]
        batch = self.inner([{k: v for k, v in f.items() if k not in extra[0]} for f in features])
        labels = batch["labels"]
        kept = torch.full_like(labels, IGNORE_INDEX)
        behaviour = torch.zeros(labels.shape, dtype=torch.float32)
        for row, e in enumerate(extra):
            positions = torch.tensor(policy_positions(labels[row].tolist(), e[POLICY_TOKENS]), dtype=torch.long)
            kept[row, positions] = labels[row, positions]
            if e[LOGPROBS]:
                behaviour[row, positions] = torch.tensor(e[LOGPROBS], dtype=torch.float32)
        batch["labels"] = kept
        batch["pg_behaviour"] = behaviour
        batch["pg_has_behaviour"] = torch.tensor([bool(e[LOGPROBS]) for e in extra])
        batch["pg_advantages"] = torch.tensor([e[ADVANTAGE] for e in extra], dtype=torch.float32)
        batch["pg_rows"] = torch.tensor([e[ROW] for e in extra], dtype=torch.long)
        return batch


@functools.cache
def trainer_class() -> type:
    """`PolicyGradientTrainer`: LLaMA-Factory's SFT trainer whose loss is training.pg_loss's. Defined on first
    use: the app environment imports every module of training/, and LLaMA-Factory is the train environment's."""
    import torch
    from llamafactory.train.sft.trainer import CustomSeq2SeqTrainer

    class PolicyGradientTrainer(CustomSeq2SeqTrainer):
        """LLaMA-Factory's SFT trainer whose loss is training.pg_loss's."""

        def __init__(self, settings: PolicyGradientConfig, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.settings = settings
            # a loss function of our own: the HF Trainer then counts the optimizer step's trained tokens
            # (num_items_in_batch, across devices too) and leaves the scaling over accumulation to compute_loss
            self.compute_loss_func = policy_gradient_loss
            self.sums: dict[str, float] = defaultdict(float)
            #: |trainer - behaviour| log-probability over the first optimizer step's tokens (training.logprob_check's
            #: gap, at no cost: the loss computes both anyway)
            self.gap: dict[str, float] = defaultdict(float)
            #: old_logprobs=trainer: each row's log-probabilities of its trained tokens before the first step
            self.old: dict[int, torch.Tensor] | None = None

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if self.settings.old_logprobs == "trainer" and self.old is None:
                self.old = self.recompute_old(model, self.rows_to_score(inputs["pg_rows"].tolist()))
            advantages, behaviour, has_behaviour, rows = (inputs.pop(key) for key in BATCH_KEYS)
            labels = inputs.pop("labels")
            outputs = model(**inputs)  # no labels: the model computes no loss of its own
            logp, mask = token_logprobs(outputs.logits, labels)
            behaviour = torch.where(has_behaviour.unsqueeze(-1), behaviour[:, 1:].to(logp.dtype), logp.detach())
            if self.state.global_step == 0:  # before the first optimizer step: the trainer's and vLLM's scores
                scored = mask & has_behaviour.unsqueeze(-1)
                self.gap["sum"] += float((logp.detach() - behaviour).abs()[scored].sum())
                self.gap["tokens"] += int(scored.sum())
            weights = None
            if self.old is not None:  # the ratio against the trainer's own, the sampler's difference weighed
                old = self.old_logprobs(rows, mask, logp)
                raw = torch.exp((old - behaviour) * mask.to(logp.dtype))
                raw = torch.where(has_behaviour.unsqueeze(-1), raw, torch.ones_like(raw))  # no sampler's: weight 1
                weights = torch.clamp(raw, max=self.settings.tis_cap)
                self.sums["tis_weight"] += float((weights * mask).sum())
                self.sums["tis_capped"] += float(((raw > self.settings.tis_cap) & mask).sum())
                behaviour = old
            ref_logp = self.reference_logprobs(model, inputs, labels) if self.settings.kl_beta > 0 else None
            loss, stats = policy_gradient_loss(
                logp,
                behaviour,
                advantages,
                mask,
                self.settings,
                ref_logp,
                self.normaliser(num_items_in_batch),
                weights,
            )
            if self.settings.aggregation == "token_mean" and num_items_in_batch is not None:
                # the count is the step's on every device and DDP / DeepSpeed average the gradients: undo that
                loss = loss * (self.accelerator.num_processes if self.args.average_tokens_across_devices else 1)
            for key, value in stats.items():
                self.sums[key] += float(value)
            return (loss, outputs) if return_outputs else loss

        def rows_to_score(self, first: list[int]) -> list[int]:
            """The rows this update will train (`rows_reached`); `first` is this process's first micro-batch."""
            args, total = self.args, len(self.train_dataset)
            size = args.per_device_train_batch_size
            rows = rows_reached(
                get_sampler_order(self.callback_handler.train_dataloader, total),
                first,
                total=total,
                size=size,
                reach=self.state.max_steps * args.gradient_accumulation_steps * size * args.world_size,
                process_index=args.process_index,
            )
            if args.world_size > 1:  # every process scores the same rows, or ZeRO-3's gathers would not pair up
                foreseen = self.accelerator.gather(torch.tensor([len(rows) < total], device=args.device))
                if not bool(foreseen.all()):
                    return list(range(total))
            return rows

        @torch.no_grad()
        def recompute_old(self, model, rows: list[int]) -> dict[int, torch.Tensor]:
            """The log-probabilities of `rows`' trained tokens under the weights the update starts from: a no-grad
            pass in batches of per_device_train_batch_size. Every process scores the same rows in the same
            batches, so that ZeRO-3's parameter gathers pair up across processes."""
            dataset, size = self.train_dataset, self.args.per_device_train_batch_size
            training = model.training
            model.eval()  # no dropout: the scores the first step's forward gives, up to padding's numerics
            old: dict[int, torch.Tensor] = {}
            for start in range(0, len(rows), size):
                batch = self._prepare_inputs(self.data_collator([dataset[i] for i in rows[start : start + size]]))
                *_, scored = (batch.pop(key) for key in BATCH_KEYS)  # the rows are the last key
                labels = batch.pop("labels")
                logp, mask = token_logprobs(model(**batch).logits, labels)
                for index, row in enumerate(scored.tolist()):
                    old[row] = logp[index][mask[index]].detach().float().cpu()
            model.train(training)
            log.info(
                "grpo: the old log-probabilities of %d of %d rows recomputed by the trainer (old_logprobs=trainer)",
                len(old),
                len(dataset),
            )
            return old

        def old_logprobs(self, rows: torch.Tensor, mask: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
            """The recomputed log-probabilities of a micro-batch's `rows`, at their trained positions (`mask`)."""
            old = torch.zeros_like(logp, dtype=logp.dtype)
            for index, row in enumerate(rows.tolist()):
                values = self.old.get(row)
                if values is None:
                    raise RuntimeError(f"grpo: row {row} is trained but was not rescored before the first step")
                if int(mask[index].sum()) != values.numel():
                    raise RuntimeError(
                        f"grpo: row {row} trains {int(mask[index].sum())} tokens here but "
                        f"{values.numel()} in the pass that recomputed its old log-probabilities"
                    )
                old[index][mask[index]] = values.to(device=logp.device, dtype=logp.dtype)
            return old.detach()

        def first_step_gap(self) -> float:
            """The mean gap of the first optimizer step (this process's tokens), warned of as
            training.logprob_check warns: beyond numerics, the ratio is not 1 where it should be."""
            from training.logprob_check import WARN_MEAN_GAP

            gap = self.gap["sum"] / self.gap["tokens"]
            if gap > WARN_MEAN_GAP:
                log.warning(
                    "grpo: the trainer's log-probabilities of the sampled tokens differ from vLLM's by %.4f on "
                    'average before the first step (above %s: more than numerics; docs/update.md, "Log-probability '
                    'fidelity")',
                    gap,
                    WARN_MEAN_GAP,
                )
            return round(gap, 6)

        def normaliser(self, num_items_in_batch) -> Any:
            """What the micro-batch's sum is divided by: the optimizer step's trained tokens (token_mean), or its
            sequences on this device (sequence_mean; the last step of an epoch may hold fewer)."""
            if self.settings.aggregation == "token_mean":
                return num_items_in_batch
            return self.args.per_device_train_batch_size * self.current_gradient_accumulation_steps

        @torch.no_grad()
        def reference_logprobs(self, model, inputs: dict[str, Any], labels: torch.Tensor) -> torch.Tensor:
            """The reference model's log-probabilities of the labels: a LoRA's base (the adapter off), else the
            reference LLaMA-Factory loads (the model the update starts from, or its `ref_model`)."""
            if self.ref_model is None:
                with self.accelerator.unwrap_model(model).disable_adapter():
                    logits = model(**inputs).logits
            else:
                logits = self.ref_model(**inputs).logits
            return token_logprobs(logits, labels)[0]

        def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
            """The step's clip fractions, mean ratio and KL beside the loss (this process's tokens)."""
            tokens = self.sums.get("tokens", 0.0)
            if "loss" in logs and tokens:
                logs["pg_clipped_low"] = round(self.sums["clipped_low"] / tokens, 6)
                logs["pg_clipped_high"] = round(self.sums["clipped_high"] / tokens, 6)
                logs["pg_ratio"] = round(self.sums["ratio"] / tokens, 6)
                if self.settings.kl_beta > 0:
                    logs["pg_kl"] = round(self.sums["kl"] / tokens, 6)
                if self.old is not None:
                    logs["pg_tis_weight"] = round(self.sums["tis_weight"] / tokens, 6)
                    logs["pg_tis_capped"] = round(self.sums["tis_capped"] / tokens, 6)
                self.sums.clear()
                if self.gap.get("tokens"):
                    logs["pg_logprob_gap"] = self.first_step_gap()
                    self.gap.clear()
            super().log(logs, *args, **kwargs)

    return PolicyGradientTrainer


def get_sampler_order(loader: Any, total: int) -> list[int] | None:
    """The order in which `loader`'s sampler hands out the dataset's `total` rows this epoch: accelerate's seeded
    random sampler replayed (RandomSampler's one permutation, from its seed and epoch), or a sequential one; None
    where it cannot be foreseen (another sampler, sampling with replacement)."""
    import torch
    from accelerate.data_loader import SeedableRandomSampler, get_sampler
    from torch.utils.data import SequentialSampler

    sampler = get_sampler(loader)
    if isinstance(sampler, SequentialSampler):
        return list(range(total))
    if isinstance(sampler, SeedableRandomSampler) and not sampler.replacement and sampler.num_samples == total:
        generator = torch.Generator().manual_seed(sampler.initial_seed + sampler.epoch)
        return torch.randperm(total, generator=generator).tolist()
    return None


def rows_reached(
    order: list[int] | None, first: list[int], *, total: int, size: int, reach: int, process_index: int
) -> list[int]:
    """The rows an update's steps reach, in the order they are trained: the first `reach` of `order` (every
    process's micro-batches of `size` together), or all `total` where the steps reach an epoch. `first`, this
    process's first micro-batch, checks the order: accelerate deals the processes batches in turn, so it is
    `order[process_index * size:]`'s start; where it is not (or no order is known) every row is returned, which
    costs time and never a wrong ratio."""
    if reach >= total:
        return list(range(total))
    start = process_index * size
    if order is None or order[start : start + len(first)] != first:
        log.info("grpo: the sampler's order could not be foreseen; all %d rows are rescored", total)
        return list(range(total))
    return order[:reach]


def with_columns(dataset: Any, directory: Path) -> Any:
    """The encoded train dataset with the policy-gradient columns (`build_columns`); says how many rows train
    on-policy for want of behaviour log-probabilities."""
    sidecar = directory / "train.token_ids.jsonl"
    columns = build_columns(dataset["labels"], load_token_ids(directory, "train"), sidecar)
    if columns.without_logprobs:
        log.warning(
            "grpo: %d of %d rows have no behaviour log-probabilities (completion_logprobs in %s): their ratio is "
            "1, the trainer's own log-probabilities detached (on-policy)",
            columns.without_logprobs,
            len(columns.advantages),
            sidecar,
        )
    dataset = dataset.add_column(ADVANTAGE, columns.advantages)
    dataset = dataset.add_column(POLICY_TOKENS, columns.policy_tokens)
    dataset = dataset.add_column(ROW, list(range(len(columns.advantages))))
    return dataset.add_column(LOGPROBS, columns.logprobs)


def run_policy_gradient(model_args, data_args, training_args, finetuning_args, callbacks, settings) -> None:
    """LLaMA-Factory's SFT workflow (`llamafactory.train.sft.workflow.run_sft`, its training part) with the
    policy-gradient columns, collator and trainer."""
    from llamafactory.data import SFTDataCollatorWith4DAttentionMask, get_dataset, get_template_and_fix_tokenizer
    from llamafactory.model import load_model, load_tokenizer
    from llamafactory.train.trainer_utils import create_ref_model

    tokenizer_module = load_tokenizer(model_args)
    tokenizer = tokenizer_module["tokenizer"]
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    dataset_module = get_dataset(template, model_args, data_args, training_args, stage="sft", **tokenizer_module)
    dataset_module["train_dataset"] = with_columns(dataset_module["train_dataset"], Path(data_args.dataset_dir))
    model = load_model(tokenizer, model_args, finetuning_args, training_args.do_train)
    # no reference model unless the KL term is on; a LoRA's reference is its base (create_ref_model: None)
    ref_model = create_ref_model(model_args, finetuning_args) if settings.kl_beta > 0 else None
    collator = SFTDataCollatorWith4DAttentionMask(
        template=template,
        model=model,
        pad_to_multiple_of=8,
        label_pad_token_id=IGNORE_INDEX,
        block_diag_attn=model_args.block_diag_attn,
        neat_packing=data_args.neat_packing,
        attn_implementation=getattr(model.config, "_attn_implementation", None),
        compute_dtype=model_args.compute_dtype,
        **tokenizer_module,
    )
    trainer = trainer_class()(
        settings=settings,
        model=model,
        args=training_args,
        finetuning_args=finetuning_args,
        data_collator=PolicyGradientCollator(collator),
        callbacks=callbacks,
        ref_model=ref_model,
        **dataset_module,
        **tokenizer_module,
    )
    result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()


def run(args: dict[str, Any], callbacks: list[Any]) -> None:
    """LLaMA-Factory's training function (`llamafactory.train.tuner._training_function`) for a grpo recipe:
    its argument parser and callbacks, this module's workflow, the process group destroyed at the end."""
    import torch.distributed as dist
    from llamafactory.hparams import get_train_args
    from llamafactory.train.callbacks import LogCallback, ReporterCallback

    args = dict(args)
    settings = PolicyGradientConfig(**args.pop(POLICY_GRADIENT))
    model_args, data_args, training_args, finetuning_args, generating_args = get_train_args(args)
    if finetuning_args.stage != "sft" or training_args.do_eval:
        raise ValueError(f"{POLICY_GRADIENT} trains stage sft without evaluation (got {finetuning_args.stage})")
    callbacks = [*callbacks, LogCallback(), ReporterCallback(model_args, data_args, finetuning_args, generating_args)]
    log.info("grpo: the policy-gradient loss with %s", settings)
    run_policy_gradient(model_args, data_args, training_args, finetuning_args, callbacks, settings)
    if dist.is_initialized():
        dist.destroy_process_group()
