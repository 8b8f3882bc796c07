"""Configuration: YAML files validated into frozen dataclasses."""

from spark_watchdog.config.agent import AgentConfig, load_agent_config
from spark_watchdog.config.files import read_yaml

__all__ = ["AgentConfig", "load_agent_config", "read_yaml"]
