"""mas_train: Dr. MAS multi-agent GRPO on TRL.

Entry points: ``mas-train``, ``mas-eval`` (:mod:`mas_train.cli`), ``mas-plot``, ``mas-compare``, ``mas-export``. The pieces, each importable on
its own (importing this package loads none of torch, transformers or TRL):

* :mod:`mas_train.trainer`: ``train(cfg)`` and ``MultiGroupTrainer``, the training loop (start-up checks in
  :mod:`mas_train.startup`).
* :mod:`mas_train.rollout`: ``RolloutCollector`` and ``Sample`` (one per agent turn, immutable).
* :mod:`mas_train.advantages`: ``compute_advantages`` (Dr. MAS eq. 5, GRPO eq. 2, the mixed ablations, SPIRAL's RAE
  with its ``RoleBaseline``) and the
  Lemma 4.2 statistics.
* :mod:`mas_train.grpo.update`: ``GroupGRPOTrainer``, the GRPO update of one model group (a ``trl.GRPOTrainer``).
* :mod:`mas_train.hosting.worker`: ``ModelGroupWorker`` (policy + update + backend, weight sync, save/load);
  :mod:`mas_train.hosting.pools` and :mod:`mas_train.hosting.ray_pool` host workers; :mod:`mas_train.lora` wraps PEFT.
* :mod:`mas_train.config`: ``TrainConfig`` and friends (dataclasses; YAML and CLI flags are views of them).
* :mod:`mas_train.backends`: generation backends (Hugging Face on CPU, SGLang on GPU, OpenAI-compatible
  endpoints for frozen agents) and their contract suite.
* :mod:`mas_train.tasks`, :mod:`mas_train.eval`, :mod:`mas_train.metrics`, :mod:`mas_train.checkpoint`,
  :mod:`mas_train.tracking`, :mod:`mas_train.tools.plots`, :mod:`mas_train.tools.compare`, :mod:`mas_train.tools.export`.

See ``docs/training.md`` for what a run logs and how to resume it.
"""

__version__ = "0.1.0"
