"""Least privilege, proven: the AWS operations each binary really called during the test
suite, against the IAM actions its role in infra/ grants. Nothing missing, nothing extra.

    least-privilege.py LOG_DIR TEMPLATE...

Every binary logs, when it stops, the operations it called (target `aws_operations`, from
`orderfleet::runtime::aws`); the suite leaves those lines in LOG_DIR (one directory per test, one log per
process). Each TEMPLATE is CloudFormation, read with cfn-lint's parser (run this with the Python
of cfn-lint's virtualenv); a role is matched to its binary by the `orderfleet:binary` tag on the
role. Actions are compared, not resources or conditions: each role names its queues and topic,
and cfn-lint and checkov check those; a condition (the relay's PutMetricData, bound to its
namespace) narrows a grant without changing its action.
"""

import pathlib
import re
import sys

from cfnlint.decode import decode

# The SDK names a service as its model does (SQS, SNS, CloudWatch: the `service` half of the
# logged `service:Operation`); IAM's prefix for it, keyed by that name in lower case. A service
# missing here stops the check rather than be guessed.
IAM_PREFIX = {
    "sqs": "sqs",
    "sns": "sns",
    "cloudwatch": "cloudwatch",
}
# A batch call is authorized as its single form.
AUTHORIZED_AS = {
    "sqs:SendMessageBatch": "sqs:SendMessage",
    "sqs:DeleteMessageBatch": "sqs:DeleteMessage",
    "sqs:ChangeMessageVisibilityBatch": "sqs:ChangeMessageVisibility",
    "sns:PublishBatch": "sns:Publish",
}
# What SQS checks on the caller's behalf besides the call itself: a move task receives and
# deletes from the DLQ, reads its attributes, and sends to the destination queue.
ALSO_NEEDS = {
    "sqs:StartMessageMoveTask": {
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:GetQueueAttributes",
        "sqs:SendMessage",
    },
}
# What an EC2 instance's first boot calls (infra/ec2.yaml's user data, deploy/ec2-bootstrap.sh):
# the release from S3 and the binary's secret set. A role keeps these in a policy named
# `bootstrap`, checked against exactly this.
BOOTSTRAP = {"s3:GetObject", "secretsmanager:GetSecretValue"}
ANSI = re.compile(r"\x1b\[[0-9;]*m")
FIELD = re.compile(r'"?(binary|operations)"?[=:]\s*"([^"]*)"')


def called(log_dir):
    """{binary: set of 'service:Operation'} from every `aws_operations` line under log_dir."""
    found = {}
    for log in pathlib.Path(log_dir).rglob("*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if "aws_operations" not in line:
                continue
            fields = dict(FIELD.findall(ANSI.sub("", line)))
            if "binary" not in fields or "operations" not in fields:
                continue
            operations = set()
            if fields["operations"] != "none":
                for service, _, name in (op.partition(":") for op in fields["operations"].split(",")):
                    prefix = IAM_PREFIX.get(service.lower())
                    if prefix is None:
                        sys.exit(f"{log}: {fields['binary']} called {service}:{name}; add {service.lower()!r} to IAM_PREFIX")
                    operations.add(f"{prefix}:{name}")
            found.setdefault(fields["binary"], set()).update(operations)
    return found


# Roles that belong to no binary, and what they are for: they are not compared here.
NOT_A_BINARY = {
    "ExecutionRole": "ECS pulls the image, writes logs and reads the secrets with it",
    "ConsoleRedriveRole": "a person's, for the SQS console's DLQ redrive (docs/security.md)",
}


def granted(template_path):
    """{binary: (role, actions, bootstrap actions)} for each role tagged `orderfleet:binary`.

    Fails on what would let a right escape the comparison: a policy outside a role's own
    `Policies` (AWS::IAM::Policy, AWS::IAM::ManagedPolicy, ManagedPolicyArns), a role that is
    neither tagged nor listed in NOT_A_BINARY, two roles for one binary, an EC2 role without
    its bootstrap policy, or a template without a single tagged role."""
    template, problems = decode(template_path)
    if problems or template is None:
        sys.exit(f"{template_path}: cannot be read: {problems}")
    roles = {}
    for name, resource in template.get("Resources", {}).items():
        if resource.get("Type") in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            sys.exit(f"{template_path}: {name}: put its statements in the role's own Policies, where this check reads them")
        if resource.get("Type") != "AWS::IAM::Role":
            continue
        tags = {t.get("Key"): t.get("Value") for t in resource.get("Properties", {}).get("Tags", [])}
        binary = tags.get("orderfleet:binary")
        if binary is None:
            if name not in NOT_A_BINARY:
                sys.exit(f"{template_path}: {name}: tag it orderfleet:binary=<binary>, or list it in NOT_A_BINARY with its reason")
            print(f"{template_path}: {name}: no binary's ({NOT_A_BINARY[name]})")
            continue
        if binary in roles:
            sys.exit(f"{template_path}: {name} and {roles[binary][0]} are both tagged orderfleet:binary={binary}")
        actions, bootstrap = set(), None
        for policy in resource["Properties"].get("Policies", []):
            allowed = set()
            for statement in policy["PolicyDocument"]["Statement"]:
                if statement.get("Effect") != "Allow":
                    continue
                action = statement["Action"]
                allowed.update([action] if isinstance(action, str) else action)
            if policy["PolicyName"] == "bootstrap":
                bootstrap = allowed
            else:
                actions |= allowed
        if resource["Properties"].get("ManagedPolicyArns"):
            sys.exit(f"{template_path}: {name} has managed policies; list its actions instead")
        trusted = resource["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        on_ec2 = any("ec2.amazonaws.com" in str(statement.get("Principal")) for statement in trusted)
        if on_ec2 and bootstrap is None:
            sys.exit(f"{template_path}: {name} is an instance's role without a bootstrap policy")
        roles[binary] = (name, actions, bootstrap)
    if not roles:
        sys.exit(f"{template_path}: no role is tagged orderfleet:binary; nothing would be compared")
    return roles


def main():
    log_dir, templates = sys.argv[1], sys.argv[2:]
    calls = called(log_dir)
    failed = False
    deployed = set()
    for template in templates:
        roles = granted(template)
        deployed |= set(roles)
        for binary in sorted(set(roles) | set(calls)):
            if binary == "stripe-sim":
                continue
            if binary not in roles:
                print(f"{template}: {binary}: not deployed by this template (no role tagged orderfleet:binary={binary})")
                continue
            role, actions, bootstrap = roles[binary]
            if bootstrap is not None and bootstrap != BOOTSTRAP:
                print(f"{template}: {role}: its bootstrap policy grants {sorted(bootstrap)}, the first boot calls {sorted(BOOTSTRAP)}")
                failed = True
            if binary not in calls:
                print(f"{template}: {role}: the suite never stopped a {binary} cleanly, so nothing proves its grants")
                failed = True
                continue
            needed = {AUTHORIZED_AS.get(op, op) for op in calls[binary]}
            needed |= set().union(*(ALSO_NEEDS.get(op, set()) for op in calls[binary]))
            missing, extra = sorted(needed - actions), sorted(actions - needed)
            status = "ok" if not (missing or extra) else "MISMATCH"
            print(f"{template}: {role} ({binary}): {status}; called {', '.join(sorted(calls[binary])) or 'nothing'}")
            if missing:
                print(f"    missing (called, not granted): {', '.join(missing)}")
            if extra:
                print(f"    extra (granted, never needed): {', '.join(extra)}")
            failed |= bool(missing or extra)
    for binary in sorted(set(calls) - deployed - {"stripe-sim"}):
        print(f"{binary} called AWS, and no template gives it a role")
        failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
