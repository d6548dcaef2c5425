"""The declarative configs (one TOML per version, the recipes, the mock cluster descriptor), shipped in the wheel as
the package `gr00t_tt_configs` so that an installed converter finds them from any directory."""
