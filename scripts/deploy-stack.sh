#!/usr/bin/env bash
# Deploys infra/messaging.yaml, unchanged, to LocalStack.
#
#   scripts/deploy-stack.sh                      the fleet's stack (orderfleet-messaging): its
#                                                outputs go to .run/stack.env (STOCK_QUEUE_URL,
#                                                NOTIFICATION_QUEUE_URL, NOTIFICATION_TOPIC_ARN,
#                                                the DLQs' URLs and ARNs)
#   scripts/deploy-stack.sh NAME NAME_PREFIX     another stack beside it; its outputs are
#                                                printed as KEY=VALUE lines instead
#
# Idempotent: a second deploy of an unchanged template changes nothing.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

name=${1:-$stack_name}
prefix=${2:-}
write_env=$([[ $# -eq 0 ]] && echo yes || echo no)
venv=$("$root/localstack/host.sh" venv)
aws() {
    AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION="${AWS_REGION:-us-east-1}" \
        "$venv/bin/aws" --endpoint-url "$localstack_url" "$@"
}

say "deploying infra/messaging.yaml as stack $name"
aws cloudformation deploy \
    --stack-name "$name" \
    --template-file "$root/infra/messaging.yaml" \
    --parameter-overrides "NamePrefix=$prefix" \
    --no-fail-on-empty-changeset >/dev/null

status=$(aws cloudformation describe-stacks --stack-name "$name" --query 'Stacks[0].StackStatus' --output text)
case "$status" in
CREATE_COMPLETE | UPDATE_COMPLETE) ;;
*) die "stack $name is $status" ;;
esac

declare -A variable=(
    [StockQueueUrl]=STOCK_QUEUE_URL
    [StockQueueArn]=STOCK_QUEUE_ARN
    [StockDlqUrl]=STOCK_DLQ_URL
    [StockDlqArn]=STOCK_DLQ_ARN
    [NotificationQueueUrl]=NOTIFICATION_QUEUE_URL
    [NotificationQueueArn]=NOTIFICATION_QUEUE_ARN
    [NotificationDlqUrl]=NOTIFICATION_DLQ_URL
    [NotificationDlqArn]=NOTIFICATION_DLQ_ARN
    [NotificationTopicArn]=NOTIFICATION_TOPIC_ARN
)
count=0
while read -r key value; do
    [[ -n "${variable[$key]:-}" ]] || continue
    if [[ $write_env == yes ]]; then set_env "${variable[$key]}" "$value"; else echo "${variable[$key]}=$value"; fi
    count=$((count + 1))
done < <(aws cloudformation describe-stacks --stack-name "$name" \
    --query 'Stacks[0].Outputs[].[OutputKey,OutputValue]' --output text)
((count == ${#variable[@]})) || die "stack $name has $count of ${#variable[@]} outputs"
say "stack $name is $status$([[ $write_env == yes ]] && echo "; outputs written to ${env_file#"$root/"}")"
