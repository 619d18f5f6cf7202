"""Train, validate or test one recall model: ``python main.py fit --config configs/p4.yaml``."""

from arbench.cli import run

if __name__ == "__main__":
    run()
