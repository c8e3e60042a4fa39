"""The experiment harness over the detectors: an evaluation config planned into units (`runconfig`, `plan`, `units`),
run and resumed (`evaluate`), swept (`selection`, `protocols`), thresholds transferred (`transfer`), tables written
(`results`: the one definition of their columns) and reported (`report`). The detectors never import it."""
