"""Base pieces every other part uses: errors, the registry, config fields, atomic file I/O, private torch APIs."""
