#!/bin/bash
# LocalStack init hook (Docker mode): deploy the messaging template, unchanged, once LocalStack
# is ready. Host mode runs scripts/deploy-stack.sh instead; both deploy the same file.
set -euo pipefail
awslocal cloudformation deploy \
    --stack-name orderfleet-messaging \
    --template-file /opt/orderfleet/infra/messaging.yaml \
    --no-fail-on-empty-changeset
