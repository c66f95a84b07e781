"""mas_train: Dr. MAS multi-agent GRPO on TRL.

Entry points: the ``mas-train`` and ``mas-eval`` commands (:mod:`mas_train.cli`). The pieces, each importable on
its own (importing this package loads none of torch, transformers or TRL):

* :mod:`mas_train.config`: ``TrainConfig`` and friends (dataclasses; YAML and CLI flags are views of them).
* :mod:`mas_train.rollout`: ``RolloutCollector`` and ``Sample`` (one per agent turn).
* :mod:`mas_train.advantages`: ``compute_advantages`` (Dr. MAS eq. 5, GRPO eq. 2, the mixed ablations).
* :mod:`mas_train.trainer`: ``GroupGRPOTrainer`` (a ``trl.GRPOTrainer`` per model group), ``ModelGroupWorker``,
  ``MultiGroupTrainer`` (the training loop).
* :mod:`mas_train.resources`: worker pools (``LocalPool``; Ray).
* :mod:`mas_train.backends`: generation backends (Hugging Face on CPU, SGLang on GPU).
* :mod:`mas_train.checkpoint`, :mod:`mas_train.tracking`, :mod:`mas_train.eval`, :mod:`mas_train.metrics`.

See ``docs/training.md`` for what a run logs and how to resume it.
"""

__version__ = "0.1.0"
