"""tests/model/tokenizer_oracle_test.py on the demo model alone (models/NAME.gguf, 8192 tokens):
the C tokenizer against Hugging Face tokenizers on the reference case's tokenizer entries and
thousands of random texts and id sequences.
usage: demo_tokenizer_oracle_test.py TOOL [N_CASES] [SEED]  (models_py_test.sh points
DS_REPO_REFERENCE_DIR at models/)"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "model"))
import tokenizer_oracle_test as oracle  # noqa: E402  (tests/model/tokenizer_oracle_test.py)

if __name__ == "__main__":
    models = os.environ.get("DS_REPO_REFERENCE_DIR", "models")
    sys.argv[1:2] = [sys.argv[1], models]  # TOOL REFERENCE_DIR [N_CASES] [SEED]
    sys.exit(oracle.main())
