"""What every lab scenario's JSON carries (`spark-watchdog lab run --json`,
`lab demo --json`'s ``scenario``): the keys scripts read, whatever ran the ranks."""

CONTRACT_KEYS = frozenset(
    {
        "scenario",
        "outcome",
        "detected_after_s",
        "recovered_after_s",
        "power_actions",
        "false_power_actions",
        "serving_restarts",
        "incident_ids",
    }
)
