"""tools/window_pricing_balance.py: both pricings schedule the same batches and are judged under
the exact windowed price; on long-tailed lengths with a narrow window the exact pricing plans
the shorter critical path (small sizes here; the README's numbers come from the defaults)."""

from tools.window_pricing_balance import main

SMALL = ["--dp-size", "4", "--cp-size", "2", "--global-batch-size", "32", "--batches", "2"]


def test_the_exact_window_price_plans_a_shorter_critical_path(capsys):
    assert main(SMALL) == 0
    ratio = float(capsys.readouterr().out.strip().splitlines()[-1].rsplit(" ", 1)[-1])
    assert 0.5 < ratio < 1.0


def test_a_share_outside_the_layers_is_one_line(capsys):
    assert main(SMALL + ["--windowed-share", "0"]) == 2
    assert capsys.readouterr().out.strip() == "error: --windowed-share 0.0 must be in (0, 1]"
