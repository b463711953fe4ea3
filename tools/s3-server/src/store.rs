//! s3s-fs's storage with one change: a GET's bytes are read with one `pread`.
//!
//! s3s-fs streams an object in 4 KiB `tokio::fs` reads, each a blocking task of its own: under
//! the benchmarks' ranged GETs (up to 2 MiB each) its CPU went to thread switches (30%) and
//! lock contention (6%), not to the bytes. Every other operation, and the GET's own checks
//! (the object, the range, conditions, ETag), are s3s-fs's.

use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use s3s::dto::*;
use s3s::{S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use s3s_fs::FileSystem;

pub struct Store {
    fs: FileSystem,
    root: PathBuf,
}

impl Store {
    pub fn new(root: &Path) -> Result<Self, String> {
        let fs = FileSystem::new(root).map_err(|e| format!("{}: {e:?}", root.display()))?;
        let root = root
            .canonicalize()
            .map_err(|e| format!("{}: {e}", root.display()))?;
        Ok(Self { fs, root })
    }

    /// Where s3s-fs keeps `bucket`/`key` (it has already refused keys outside its root).
    fn path(&self, bucket: &str, key: &str) -> S3Result<PathBuf> {
        let relative = Path::new(bucket).join(key);
        if relative.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(S3Error::with_message(
                S3ErrorCode::InvalidArgument,
                "key leaves the bucket",
            ));
        }
        Ok(self.root.join(relative))
    }
}

/// The first byte and length of a GET's answer: its `Content-Range` (`bytes a-b/size`), else
/// the whole object.
fn span(output: &GetObjectOutput) -> Option<(u64, usize)> {
    match output.content_range.as_deref() {
        Some(range) => {
            let (first, last) = range.strip_prefix("bytes ")?.split('/').next()?.split_once('-')?;
            let (first, last): (u64, u64) = (first.parse().ok()?, last.parse().ok()?);
            Some((first, usize::try_from(last.checked_sub(first)? + 1).ok()?))
        }
        None => Some((0, usize::try_from(output.content_length?).ok()?)),
    }
}

/// The `S3` impl: every listed operation forwarded to s3s-fs, and the items given. (One macro
/// for the whole impl: `#[async_trait]` must see the methods themselves, not a macro call.)
macro_rules! s3_impl {
    (forward { $($method:ident: $input:ty => $output:ty;)* } $($item:item)*) => {
        #[async_trait::async_trait]
        impl S3 for Store {
            $(
                async fn $method(&self, req: S3Request<$input>) -> S3Result<S3Response<$output>> {
                    self.fs.$method(req).await
                }
            )*
            $($item)*
        }
    };
}

s3_impl! {
    forward {
        abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
        complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput;
        copy_object: CopyObjectInput => CopyObjectOutput;
        create_bucket: CreateBucketInput => CreateBucketOutput;
        create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput;
        delete_bucket: DeleteBucketInput => DeleteBucketOutput;
        delete_object: DeleteObjectInput => DeleteObjectOutput;
        delete_objects: DeleteObjectsInput => DeleteObjectsOutput;
        get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput;
        head_bucket: HeadBucketInput => HeadBucketOutput;
        head_object: HeadObjectInput => HeadObjectOutput;
        list_buckets: ListBucketsInput => ListBucketsOutput;
        list_objects: ListObjectsInput => ListObjectsOutput;
        list_objects_v2: ListObjectsV2Input => ListObjectsV2Output;
        list_parts: ListPartsInput => ListPartsOutput;
        put_object: PutObjectInput => PutObjectOutput;
        upload_part: UploadPartInput => UploadPartOutput;
        upload_part_copy: UploadPartCopyInput => UploadPartCopyOutput;
    }

    async fn get_object(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let path = self.path(&req.input.bucket, &req.input.key)?;
        let mut response = self.fs.get_object(req).await?;
        let Some((first, len)) = span(&response.output) else {
            return Ok(response); // an answer this cannot read: s3s-fs's own body
        };
        let bytes = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
            let file = std::fs::File::open(path)?;
            let mut buf = vec![0; len];
            file.read_exact_at(&mut buf, first)?;
            Ok(buf)
        })
        .await
        .map_err(S3Error::internal_error)?
        .map_err(S3Error::internal_error)?;
        response.output.body = Some(StreamingBlob::from(s3s::Body::from(Bytes::from(bytes))));
        Ok(response)
    }
}
