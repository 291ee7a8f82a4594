"""Plain TRL GRPOTrainer runs the calculator env's multi-turn tool loop via environment_factory."""

from __future__ import annotations

import copy

from datasets import Dataset
from support.scripted_agent import scripted_calculator_model
from trl import GRPOConfig, GRPOTrainer

from composer_replication.envs.calculator import (
    CalculatorEnv,
    CalculatorTools,
    calculator_reward,
)
from composer_replication.lm.chat_templates import ensure_tool_template


def test_grpo_two_steps_with_tool_mask(tokenizer, tmp_path):
    tok = copy.deepcopy(tokenizer)
    ensure_tool_template(tok)
    rows = CalculatorEnv(per_kind=50).rows("train")[:4]
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=96,
        max_steps=2,
        max_tool_calling_iterations=2,
        learning_rate=1e-3,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        use_cpu=True,
        seed=0,
        generation_kwargs={"use_cache": False},
    )
    trainer = GRPOTrainer(
        model=scripted_calculator_model(tok),
        reward_funcs=calculator_reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        environment_factory=CalculatorTools,
    )
    batches = []
    original = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: (
        batches.append(original(inputs)) or batches[-1]
    )
    trainer.train()
    assert len(batches) >= 1
    batch = batches[0]
    mask, ids = batch["tool_mask"], batch["completion_ids"]
    assert mask.shape == ids.shape and (mask == 0).any() and (mask == 1).any()
    tool_text = tok.decode(ids[0][(mask[0] == 0) & (batch["completion_mask"][0] == 1)])
    assert "<|im_start|>tool\n13936" in tool_text  # the tool's result (208 * 67), masked out
    assert "tool_call" not in tool_text  # the model's own call is not masked
    logs = {k: v for h in trainer.state.log_history for k, v in h.items()}
    assert logs["tools/call_frequency"] > 0 and logs["tools/failure_frequency"] == 0
    assert any(isinstance(e, CalculatorTools) and e.calls for e in trainer.environments)
