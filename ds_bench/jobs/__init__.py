"""What the commands that start jobs share (sweep, scaling, capacity): launch commands, spawning a job and reading back its outcome, sweep points and memory prediction; ``ds-bench launch``."""
