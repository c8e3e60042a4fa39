"""The open-set section of a report (`oodforge report --openset`): each run's rows with the Open-Insect evaluator's
ood.csv columns (TNR@10, TNR@20, AUROC, AUPR, FPR, ACC, AUOSCR, OpenAUC, OSA, OOSA; `detectors.openset_metrics`) in
its column order, in percent. The papers' own tables are left as the papers print them."""
from __future__ import annotations

import pandas as pd

from detectors.harness.openset import ood_csv_table
from detectors.harness.report.html import Section
from detectors.harness.report.names import method_label, region_label, set_label
from detectors.harness.report.render import frame_view
from detectors.harness.report.sections import Out
from detectors.openset_metrics import OPENSET_RATES

NOTE = ("The Open-Insect evaluator's ood.csv columns (src/openood/evaluators/metrics.py), in percent: TNR@10 / TNR@20 "
        "the ID rows kept at 90% / 80% of OOD detected, AUPR average precision with OOD positive, FPR at 95% of OOD "
        "detected, ACC the ID test accuracy of the classifier the row scores with, AUOSCR the area under the open-set "
        "classification-rate curve, OpenAUC XCurve's, OSA the best open-set accuracy on the test set, OOSA the "
        "open-set accuracy at the threshold chosen on ID val against OOD val. Empty: no classifier predictions, no "
        "OOD validation (OSA, OOSA) or a table written before these columns.")


def openset_section(out: Out, results: pd.DataFrame, region: str | None = None) -> Section | None:
    """The section of one run's results (metrics already in percent, as `read_results` gives them): openset.{md,csv}
    (`openset_<region>` per region); None, with a line in the log, when the table has none of the columns."""
    present = [c for c in OPENSET_RATES if c in results.columns and results[c].notna().any()]
    where = f" ({region_label(region)})" if region else ""
    if not present:
        out.log(f"report: --openset{where}: the results table has no open-set column (written before them)")
        return None
    table = ood_csv_table(results, fractions=False)
    shown = table.assign(method=[method_label(m) for m in table["method"]],
                         ood_set=[set_label(s) for s in table["ood_set"]])
    view = frame_view(shown, NOTE, labels={"method": "Method", "ood_set": "OOD set"})
    stem = f"openset_{region}" if region else "openset"
    return Section(f"Open-set metrics{where}", [view], out.tables(stem, [view], table, latex=False))


__all__ = ["NOTE", "openset_section"]
