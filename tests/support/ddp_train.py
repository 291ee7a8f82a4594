"""One rank of a multi-process ``run_training`` (started by torchrun): trains, then writes
this rank's final-weight checksum to ``{output_dir}/rank-{r}.sha`` so a test can compare ranks.

    torchrun --nproc_per_node 2 -m support.ddp_train key=value ...
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    import torch

    from composer_replication.config import load_config
    from composer_replication.diloco.outer import params_checksum
    from composer_replication.run.train import build_trainer, prepare

    cfg = load_config(None, argv)
    torch.set_num_threads(1)
    model, tokenizer, env = prepare(cfg)
    trainer = build_trainer(cfg, model, tokenizer, env)
    trainer.train()
    rank = int(os.environ.get("RANK", 0))
    sha = params_checksum(p.detach() for p in trainer.model.parameters())
    Path(cfg.output_dir, f"rank-{rank}.sha").write_text(sha)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
