# orderfleet: the two commands are `make demo` and `make test`; see README.md.
SHELL := /bin/bash
.DEFAULT_GOAL := help
.PHONY: help up down demo test bench image

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{ printf "  make %-6s %s\n", $$1, $$2 }'

up: ## start PostgreSQL + LocalStack, deploy the messaging stack, build, migrate (idempotent)
	@scripts/up.sh

down: ## stop what `make up` started
	@scripts/down.sh

demo: ## run the main job: a flash sale through the whole fleet (built optimized), with a summary
	@ORDERFLEET_PROFILE=release scripts/up.sh
	@scripts/with-env.sh scripts/demo.sh

test: up ## the whole suite: format, lint (Rust + CloudFormation), unit and end-to-end tests
	@scripts/with-env.sh scripts/test.sh

bench: ## N orders through the optimized fleet, with LocalStack's own ceiling (BENCH_ARGS="--orders N --no-batching")
	@ORDERFLEET_PROFILE=release scripts/up.sh
	@scripts/bench.sh

image: ## the fleet's one image (Dockerfile): with Docker if it answers, else buildah (IMAGE=name:tag)
	@scripts/image.sh
