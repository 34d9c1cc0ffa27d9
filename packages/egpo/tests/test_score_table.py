"""score_table: BFCL score files -> a markdown table with 95% Wilson intervals."""

from __future__ import annotations

import pytest

from palaestra.egpo.bfcl_results import write_score_file
from palaestra.egpo.score_table import main, read_counts, table

Z = 1.959963984540054  # the 0.975 normal quantile


def test_table_reads_bfcl_score_files_and_wilson_intervals(tmp_path, capsys):
    base, sft = tmp_path / "base", tmp_path / "sft"
    write_score_file(base / "bfcl", "simple_python", 0, [{"id": f"simple_python_{i}"} for i in range(50)], 50)
    write_score_file(base / "bfcl", "multiple", 12, [], 12)
    write_score_file(sft / "bfcl", "simple_python", 4, [{"id": "x"}] * 12, 16)
    write_score_file(sft / "bfcl", "multiple", 3, [{"id": "y"}] * 9, 12)
    assert read_counts(sft, "multiple") == (3, 12)
    # closed forms at the ends: 0/n -> [0, z^2/(n+z^2)], n/n -> [n/(n+z^2), 1]; 4/16 -> [0.10, 0.49] (the
    # textbook Wilson interval: centre (p + z^2/2n)/(1 + z^2/n), half-width z sqrt(p(1-p)/n + z^2/4n^2)/(1 + z^2/n))
    hi0 = Z * Z / (50 + Z * Z)
    lo12 = 12 / (12 + Z * Z)
    p, n = 3 / 12, 12
    centre, half = (
        (p + Z * Z / (2 * n)) / (1 + Z * Z / n),
        Z * (p * (1 - p) / n + Z * Z / (4 * n * n)) ** 0.5 / (1 + Z * Z / n),
    )
    assert table([("base", base), ("sft", sft)], ["simple_python", "multiple"]).splitlines() == [
        "| model | simple_python | multiple |",
        "| --- | --- | --- |",
        f"| base | 0/50 [0.00, {hi0:.2f}] | 12/12 [{lo12:.2f}, 1.00] |",
        f"| sft | 4/16 [0.10, 0.49] | 3/12 [{centre - half:.2f}, {centre + half:.2f}] |",
    ]
    main([f"sft={sft}", "--categories", "simple_python"])
    assert "| sft | 4/16 [0.10, 0.49] |" in capsys.readouterr().out
    # pooled rows sum the runs' counts: 0/50 + 4/16 = 4/66, the interval over the 66 answers
    p, n = 4 / 66, 66
    centre, half = (
        (p + Z * Z / (2 * n)) / (1 + Z * Z / n),
        Z * (p * (1 - p) / n + Z * Z / (4 * n * n)) ** 0.5 / (1 + Z * Z / n),
    )
    main([f"both={base},{sft}", "--categories", "simple_python", "multiple"])
    assert f"| both | 4/66 [{centre - half:.2f}, {centre + half:.2f}] | 15/24 [" in capsys.readouterr().out


def test_missing_scores_and_bad_arguments_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="no BFCL score file for 'parallel'"):
        read_counts(tmp_path, "parallel")
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "expected LABEL=DIR" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([f"run={tmp_path},"])
    assert "expected LABEL=DIR" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main([f"run={tmp_path}"])
    assert exit_info.value.code == 2 and "no BFCL score file" in capsys.readouterr().err
