# The front door. `make demo` and `make test` install what is missing, build, and run.
BUILD ?= build
PREFIX ?= /usr/local
JOBS ?= $(shell nproc)
export OMP_NUM_THREADS ?= $(shell nproc)

.PHONY: setup build test demo demo-3d demo-llama demo-moe bench install clean

setup:
	@bash scripts/setup.sh

build: setup
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) $(TARGET)

# Tests share the cores (ctest -j): idle OpenMP threads must sleep, not spin.
test: build
	@cd $(BUILD) && OMP_WAIT_POLICY=PASSIVE ctest --output-on-failure -j $(JOBS)

demo: TARGET = --target myriad
demo: build
	@bash scripts/demo.sh

# The demo model on 8 local processes: tensor x pipeline x data parallel = 2 x 2 x 2, through the
# launcher (one OpenMP thread each). A shorter run: it shows the 3D layout training, not the
# finished demo.
demo-3d: TARGET = --target myriad
demo-3d: build
	@RUN_DIR=runs/demo-3d NPROC=8 OMP_NUM_THREADS=1 bash scripts/demo.sh --set train.steps=300 \
	  --set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2

# The Llama demo (configs/demo-llama.toml): RMSNorm, rotary positions, SwiGLU and grouped-query
# attention on the same corpus and budget as the GPT demo.
demo-llama: TARGET = --target myriad
demo-llama: build
	@RUN_DIR=runs/demo-llama CONFIG=configs/demo-llama.toml bash scripts/demo.sh

# The mixture-of-experts demo (configs/demo-moe.toml): the Llama demo's MLPs as 16 experts, 4 per
# token, of the same active size.
demo-moe: TARGET = --target myriad
demo-moe: build
	@RUN_DIR=runs/demo-moe CONFIG=configs/demo-moe.toml bash scripts/demo.sh

bench: TARGET = --target myriad
bench: build
	@bash bench/cpu_vs_torch.sh

# PREFIX/bin/myriad and PREFIX/share/myriad/ (its tools and the config presets): an installed
# myriad finds its tools relative to itself, from any directory.
install: TARGET = --target myriad
install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD)
