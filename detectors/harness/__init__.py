"""The experiment harness over the detectors: an evaluation config planned into units (`runconfig`, `plan`, `units`),
prepared, run unit by unit and written (`prepare`, `execute`, `outputs`; `evaluate` across processes, resumed),
the few-shot sweep (`fewshot`), swept (`selection`, `protocols`), thresholds transferred (`transfer`), tables written
(`results`: the one definition of their columns) and reported (`report`). The detectors never import it."""
