"""By hand, not in the suite: plain TRL GRPOTrainer, 2 steps, calculator env, real embedded model."""

import os
import time

os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from composer_replication.envs.calculator import CalculatorEnv, CalculatorTools, calculator_reward
from composer_replication.lm.chat_templates import ensure_tool_template
from composer_replication.lm.models import (
    DEFAULT_MODEL,
    load_model,
    load_tokenizer,
    resolve_model_path,
)

p = resolve_model_path(DEFAULT_MODEL)
tok, model = load_tokenizer(p), load_model(p)
ensure_tool_template(tok)
rows = CalculatorEnv().rows("train")[:8]
args = GRPOConfig(
    output_dir="/tmp/agent_real2_out",
    per_device_train_batch_size=4,
    num_generations=4,
    max_completion_length=128,
    max_steps=2,
    max_tool_calling_iterations=2,
    learning_rate=1e-5,
    report_to="none",
    logging_steps=1,
    save_strategy="no",
    use_cpu=True,
    seed=0,
    temperature=1.0,
)
t = time.time()
tr = GRPOTrainer(
    model=model,
    reward_funcs=calculator_reward,
    args=args,
    train_dataset=Dataset.from_list(rows),
    processing_class=tok,
    environment_factory=CalculatorTools,
)
tr.train()
for h in tr.state.log_history:
    print(
        {
            k: h[k]
            for k in h
            if k.startswith(("tools/", "reward", "step_time", "loss")) or k == "step"
        }
    )
print("seconds", round(time.time() - t, 1))
