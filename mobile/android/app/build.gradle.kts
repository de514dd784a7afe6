plugins {
    id("com.android.application")
    id("org.jetbrains.kotlin.android")
}

android {
    namespace = "org.kbert.classifier"
    compileSdk = 35

    defaultConfig {
        applicationId = "org.kbert.classifier"
        minSdk = 24
        targetSdk = 35
        versionCode = 1
        versionName = "0.1.0"
    }

    buildTypes {
        release {
            isMinifyEnabled = false
        }
    }

    // MediaPipe memory-maps the model from the APK, which needs it stored uncompressed.
    androidResources {
        noCompress += "tflite"
    }

    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }

    kotlinOptions {
        jvmTarget = "17"
    }
}

dependencies {
    // The Python side writes and checks the model with mediapipe 0.10.21.
    implementation("com.google.mediapipe:tasks-text:0.10.21")
}
