"""Tools that read finished runs: ``mas-report`` (:mod:`mas_train.tools.report`)."""
