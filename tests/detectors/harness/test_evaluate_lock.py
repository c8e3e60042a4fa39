"""Two evaluations on one `out`: while another process holds the folder, the runner is refused in
one line before any model loads and writes nothing; `--dry-run` takes no lock."""
from __future__ import annotations

import yaml
from helpers.locks import held
from runner_helpers import eval_config, evaluate_main

from pipelines.cli import run_main
from pipelines.locks import LOCK_NAME


def test_a_second_evaluation_on_the_same_out_is_refused_in_one_line(digits, tmp_path, capsys):
    out = tmp_path / "run"
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump(eval_config(digits, out, detectors=["msp"])))
    main = evaluate_main().main
    with held(out, "evaluate") as holder:
        assert run_main(main, ["--config", str(config)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{out}: in use by pid {holder.pid} on " in err and "(evaluate" in err
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]
        assert run_main(main, ["--config", str(config), "--dry-run"]) == 0
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]
