#!/bin/sh
# Gives each namespace of minio.tenants a MinIO user of its own, allowed into its own bucket alone,
# so that runs there never hold MinIO's root credentials. Run by the chart's post-install and
# post-upgrade hook Job (templates/minio-tenants.yaml) in MinIO's mc image, and by
# tests/integration/test_minio_tenants.py against a real MinIO. Safe to run again: every step
# sets what should be, whatever is there.
#
#   MINIO_URL                             MinIO's S3 endpoint
#   MINIO_ROOT_USER, MINIO_ROOT_PASSWORD  the root credentials (the chart's s3.existingSecret)
#   TENANT_KEYS_DIR                       one file per user, named after it, holding its secret key
#   arguments                             USER=BUCKET, one per tenant
#
# Users named spotray-tenant-* that no argument names were made by an earlier run of this script
# for a namespace since taken out of minio.tenants: they are removed, with their policies.
set -eu

PREFIX=spotray-tenant-
# mc keeps its aliases in a config dir; the pod's root filesystem is read-only.
MC="mc --config-dir ${MC_CONFIG_DIR:-/tmp/mc} --quiet"

fail() {
  echo "minio-tenants: $*" >&2
  exit 1
}

: "${MINIO_URL:?MINIO_URL: MinIO's S3 endpoint is not set}"
: "${MINIO_ROOT_USER:?MINIO_ROOT_USER is not set (AWS_ACCESS_KEY_ID of s3.existingSecret)}"
: "${MINIO_ROOT_PASSWORD:?MINIO_ROOT_PASSWORD is not set (AWS_SECRET_ACCESS_KEY of s3.existingSecret)}"
: "${TENANT_KEYS_DIR:?TENANT_KEYS_DIR: the directory of tenant secret keys is not set}"

# The Job is restarted on failure (backoffLimit), which also waits out a MinIO still starting.
$MC alias set spotray "$MINIO_URL" "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD" >/dev/null ||
  fail "cannot log in to MinIO at $MINIO_URL with s3.existingSecret's keys (not up yet, or not its root credentials)"

policy_file="${MC_CONFIG_DIR:-/tmp/mc}/policy.json"
wanted=" "
for pair in "$@"; do
  user=${pair%%=*}
  bucket=${pair#*=}
  case "$user" in
    "$PREFIX"?*) ;;
    *) fail "user $user: tenant users are named $PREFIX<namespace>" ;;
  esac
  [ -s "$TENANT_KEYS_DIR/$user" ] || fail "no secret key for $user in $TENANT_KEYS_DIR"
  wanted="$wanted$user "

  $MC mb --ignore-existing "spotray/$bucket" >/dev/null
  # What spotray's store does in its bucket: list, read, write (multipart too), delete. Nothing on
  # other buckets, no bucket settings, no ListAllMyBuckets.
  cat >"$policy_file" <<POLICY
{
  "Version": "2012-10-17",
  "Statement": [
    {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation", "s3:ListBucketMultipartUploads"],
     "Resource": ["arn:aws:s3:::$bucket"]},
    {"Effect": "Allow",
     "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
     "Resource": ["arn:aws:s3:::$bucket/*"]}
  ]
}
POLICY
  $MC admin policy create spotray "$user" "$policy_file" >/dev/null
  # Adding an existing user sets its secret key: the Secret in the namespace is the truth.
  $MC admin user add spotray "$user" "$(cat "$TENANT_KEYS_DIR/$user")" >/dev/null
  # Attaching a policy already attached is an error to mc; what counts is that it is attached.
  $MC admin policy attach spotray "$user" --user "$user" >/dev/null 2>&1 ||
    $MC admin user info spotray "$user" | grep -q "PolicyName: *$user\$" ||
    fail "could not attach policy $user to user $user"
  echo "tenant $user: bucket $bucket only"
done

# Listed first, on its own: a failed listing stops the script (set -e), never reads as "no users".
users=$($MC --json admin user list spotray)
for user in $(printf '%s\n' "$users" | sed -n "s/.*\"accessKey\": *\"\($PREFIX[^\"]*\)\".*/\1/p"); do
  case "$wanted" in
    *" $user "*) ;;
    *)
      $MC admin user rm spotray "$user" >/dev/null
      # Its policy too; one that cannot be removed is attached to no one now, so it is only untidy.
      $MC admin policy rm spotray "$user" >/dev/null 2>&1 || echo "tenant $user: policy $user left in place" >&2
      echo "tenant $user: removed (no longer in minio.tenants)"
      ;;
  esac
done
