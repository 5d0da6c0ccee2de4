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

demo: ## run the main job: a flash sale through the whole fleet, with a summary
	@scripts/demo.sh

test: ## the whole suite: format, lint (Rust + CloudFormation), model check, unit and end-to-end tests, the image
	@scripts/test.sh

bench: ## N orders through the optimized fleet, with LocalStack's own ceiling (BENCH_ARGS="--orders N --no-batching")
	@ORDERFLEET_BUILD=release scripts/up.sh
	@scripts/bench.sh

image: ## the shipped image (Dockerfile, fat LTO) and the EC2 tarball, then the fleet run from it pays an order (IMAGE=name:tag)
	@ORDERFLEET_BUILD=tests scripts/up.sh
	@scripts/image.sh
	@scripts/image-test.sh "$${IMAGE:-localhost/orderfleet:dev}"
