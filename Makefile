# The front door. `make demo` and `make test` install what is missing, build, and run.
BUILD ?= build
JOBS ?= $(shell nproc)
export OMP_NUM_THREADS ?= $(shell nproc)

.PHONY: setup build test demo bench clean

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

bench: TARGET = --target myriad
bench: build
	@bash bench/cpu_vs_torch.sh

clean:
	rm -rf $(BUILD)
