"""The console line of a step: small values stay readable and each algorithm's own metrics show."""

from rlx.launch.display import format_metrics


def test_a_tiny_logprob_mismatch_is_not_printed_as_zero():
    line = format_metrics({"reward_mean": 0.5, "logprob_diff_mean": 4.2e-7, "time_step": 0.14})
    assert "|dlogp|=4.2e-07" in line and "s/step=0.14" in line


def test_each_algorithm_shows_its_own_metrics():
    assert "vloss=0.102" in format_metrics({"value_loss": 0.102, "critic_explained_variance": 0.01})
    assert "rkl=1.670" in format_metrics({"distill_reverse_kl": 1.67})
    assert "tool_ok=0.97 turns=2.0" in format_metrics({"tool_call_success_rate": 0.97, "turns_per_episode": 2.0})
    assert "stale=0.50" in format_metrics({"staleness_mean": 0.5})
    assert "vloss" not in format_metrics({"reward_mean": 0.3})  # GRPO has no critic: nothing to show


def test_the_ready_line_names_the_launched_servers_openai_endpoints():
    from pathlib import Path

    from rlx.config import load_config
    from rlx.launch.launcher import _openai_endpoints

    config = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml")
    cfg = load_config(config, ["rollout.openai_port=8000", "rollout.num_servers=2"])
    assert _openai_endpoints(cfg) == "; OpenAI-compatible endpoints: http://127.0.0.1:8000/v1, http://127.0.0.1:8001/v1"
    assert _openai_endpoints(load_config(config, [])) == ""


def test_lines_logged_in_pre_flight_reach_the_log_once_it_opens(tmp_path):
    """The pre-flight logs (the offload decision, a stale buffer removed) before the run directory's log exists."""
    from rlx.launch.display import Display

    display = Display(total_steps=1, enabled=False)
    display.log("placement: the trainer stays on the GPU while the engine generates")
    display.log_to(tmp_path / "logs" / "train.log")
    display.log("run directory made")
    display.close_log()
    lines = (tmp_path / "logs" / "train.log").read_text().splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [
        "placement: the trainer stays on the GPU while the engine generates",
        "run directory made",
    ]
